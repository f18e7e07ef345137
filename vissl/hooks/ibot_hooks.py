"""``IBOTHook`` (VISSL's name): the teacher of ``ibot_loss``, ``dinov2_loss`` and
``msn_loss`` is driven by the one
:class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook`.

``on_forward`` the teacher runs on the UNMASKED global views (its head given the masks
when it scores masked patches only, :func:`~vissl.losses.self_distillation.teacher_global_output`);
its output and the temperatures of the iteration or epoch go to the loss as arguments;
``on_update`` the teacher follows the student (a cosine to ``final_momentum``).
"""

from __future__ import annotations

from vissl.hooks.momentum_teacher_hook import MomentumTeacherHook

#: VISSL's name of iBOT's hook
IBOTHook = MomentumTeacherHook

__all__ = ["IBOTHook"]

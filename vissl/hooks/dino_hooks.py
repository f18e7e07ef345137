"""``DINOHook`` (VISSL's name): DINO's teacher is driven by the one
:class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook`.

``DINOHook(loss)`` is that hook: the teacher's output on ``crops_for_teacher`` and the
temperature of the iteration go to the loss as arguments, the teacher follows the
student after each optimizer step (DINO's cosine momentum), and a train phase whose
mean loss sits at ``ln(output_dim)`` is reported as collapse. The maths
(:func:`teacher_temperature`, :func:`single_tensor`) lives in
:mod:`vissl.losses.dino_loss`.
"""

from __future__ import annotations

from vissl.hooks.momentum_teacher_hook import MomentumTeacherHook
from vissl.losses.dino_loss import single_tensor, teacher_temperature

#: VISSL's name of DINO's hook
DINOHook = MomentumTeacherHook

__all__ = ["DINOHook", "single_tensor", "teacher_temperature"]

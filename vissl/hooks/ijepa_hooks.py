"""``IJEPAHook`` (VISSL's name): I-JEPA's target encoder is driven by the one
:class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook`.

``on_forward`` the target encoder's layer-normed patch tokens of the whole images
(``sample["input"]["data"]``) go to ``ijepa_loss`` as ``teacher_output``; ``on_update`` the
target encoder follows the model's trunk, ``target = m * target + (1 - m) * trunk``, ``m``
I-JEPA's linear schedule from ``momentum`` to ``final_momentum``.
"""

from __future__ import annotations

from vissl.hooks.momentum_teacher_hook import MomentumTeacherHook

#: VISSL's name of I-JEPA's hook
IJEPAHook = MomentumTeacherHook

__all__ = ["IJEPAHook"]

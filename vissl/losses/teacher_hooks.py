"""The hook a momentum-teacher loss asks for, declared at the loss layer.

:class:`~vissl.models.momentum.MomentumTeacherOwner` lives in ``models`` (below the
trainer, which imports it), so it cannot name a hook without an import circle; the losses
that own a teacher mix this in beside it, as every loss declares its hooks
(``required_hooks``, a lazy import from ``hooks``).
"""

from __future__ import annotations

from typing import Any


class DrivenByMomentumTeacherHook:
    """Mixin: ``required_hooks()`` returns one
    :class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook` bound to the loss."""

    def required_hooks(self) -> list[Any]:
        from vissl.hooks.momentum_teacher_hook import MomentumTeacherHook

        return [MomentumTeacherHook(self)]

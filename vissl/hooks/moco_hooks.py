"""``MoCoHook`` (VISSL's name): MoCo v2's momentum encoder is driven by the one
:class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook`.

``on_forward`` the keys (the momentum encoder on ``sample["data_momentum"]``, with
shuffle BN across ranks: :func:`shuffle_across_ranks`) and whether to enqueue them go to
``moco_loss`` as arguments; ``on_update`` the encoder follows the model,
``theta_k = m * theta_k + (1 - m) * theta_q`` (so the keys of step t are encoded with the
parameters MoCo's own loop would use: updated from the model after step t - 1).
"""

from __future__ import annotations

from vissl.hooks.momentum_teacher_hook import MomentumTeacherHook
from vissl.losses.moco_loss import shuffle_across_ranks, unshuffle_across_ranks

#: VISSL's name of MoCo's hook
MoCoHook = MomentumTeacherHook

__all__ = ["MoCoHook", "shuffle_across_ranks", "unshuffle_across_ranks"]

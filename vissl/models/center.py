"""``Center``: the running mean of a teacher's outputs that DINO, iBOT and DINOv2 subtract.

One rule for all three:

- ``update(rows)``: ``center = m * center + (1 - m) * mean``, the mean of the rows of
  EVERY rank: their sum over the ranks divided by the true number of rows (one
  all-reduce of ``[sum, count]``), so ranks with unequal batches weigh by their rows;
- with no row on any rank the center stays (no host read decides it);
- ``apply(logits, temperature)``: ``softmax((logits - center) / temperature)``.

The center tensor stays the loss's own buffer (``loss.center``, ``loss.center2``): the
checkpoint keys do not change. :class:`Center` reads it by name each time, so moving
the loss (``.to``) or loading a state dict keeps it valid.

``update_form`` is the one thing that differs between the methods, and only in the last
bit: DINO scales then adds in place (``center.mul_(m).add_(mean, alpha=1 - m)``, a fused
multiply-add on most CPUs), iBOT and DINOv2 add two products
(``center * m + mean * (1 - m)``). Each keeps its own so that trained weights and old
checkpoints resume bitwise.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from vissl.utils.distributed import all_reduce_sum

__all__ = ["Center", "ema_center_", "global_row_sum_and_count"]

UpdateForm = Literal["scale_add", "weighted_sum"]


@torch.no_grad()
def global_row_sum_and_count(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of the rows, number of rows)`` over every rank, in float32 (one all-reduce).

    Args:
        rows: ``(N, D)`` on this rank (N may be 0).
    """
    rows = rows.detach().float()
    stats = torch.cat([rows.sum(dim=0), rows.new_full((1,), float(rows.shape[0]))])
    all_reduce_sum(stats)
    return stats[:-1], stats[-1]


@torch.no_grad()
def ema_center_(
    center: torch.Tensor,
    rows: torch.Tensor,
    momentum: float,
    update_form: UpdateForm = "weighted_sum",
) -> None:
    """``center = momentum * center + (1 - momentum) * mean of rows over the GLOBAL batch``
    (in place); with no row on any rank the center stays.

    Args:
        center: the tensor, any shape of ``D`` elements.
        rows: ``(N, D)`` teacher outputs of this rank (N may be 0).
        momentum: the EMA factor.
        update_form: the arithmetic (see the module docstring).
    """
    total, count = global_row_sum_and_count(rows)
    mean = (total / count.clamp(min=1.0)).reshape(center.shape)
    if update_form == "scale_add":
        updated = center.mul(momentum).add_(mean, alpha=1.0 - momentum)
    else:
        updated = center * momentum + mean * (1.0 - momentum)
    center.copy_(torch.where(count > 0, updated, center))


class Center:
    """The EMA center held in ``owner``'s buffer ``name`` (see the module docstring).

    Args:
        owner: the module holding the buffer (the loss).
        name: the buffer's name (its checkpoint key).
        momentum: the EMA factor ``m``.
        update_form: ``scale_add`` (DINO) or ``weighted_sum`` (iBOT, DINOv2).
    """

    def __init__(
        self,
        owner: nn.Module,
        name: str,
        momentum: float,
        update_form: UpdateForm = "weighted_sum",
    ) -> None:
        if name not in owner._buffers:
            raise ValueError(f"{type(owner).__name__} has no buffer {name!r} to center with.")
        self._owner = owner
        self.name = name
        self.momentum = float(momentum)
        self.update_form: UpdateForm = update_form

    @property
    def value(self) -> torch.Tensor:
        """The center tensor (the owner's buffer)."""
        tensor = self._owner._buffers[self.name]
        assert tensor is not None
        return tensor

    def apply(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        """``softmax((logits - center) / temperature)`` over the last dimension."""
        return torch.softmax((logits - self.value) / temperature, dim=-1)

    def update(self, rows: torch.Tensor) -> None:
        """Move the center towards the mean of ``rows`` ``(N, D)`` over every rank."""
        ema_center_(self.value, rows, self.momentum, self.update_form)

    def __repr__(self) -> str:
        return f"Center({self.name!r}, momentum={self.momentum}, {self.update_form})"

"""``bce_logits_multiple_output_single_target``: multi-label BCE of several heads.

For multi-label classification (VOC07, OpenImages): every output ``(B, C)`` holds one
logit per class, the target ``(B, C)`` holds 1 (present), 0 (absent) or -1 (ignored, e.g.
a "difficult" VOC object). Per output, with ``l_bc`` the binary cross entropy of logit
``x_bc`` against ``t_bc`` and ``V_c`` the samples whose target for class ``c`` is not -1::

    reduction "none" (VISSL's default):  sum_c  (1 / max(|V_c|, 1)) * sum_{b in V_c} l_bc
    reduction "mean":                    sum_{(b, c) valid} l_bc / max(#valid, 1)
    reduction "sum":                     sum_{(b, c) valid} l_bc

The loss is the sum over outputs (several heads, or the layers of linear evaluation).
VISSL ran only ``none`` (its other reductions failed on the ignore mask).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import nn

from vissl.config.params import OneOf, parse
from vissl.losses import register_loss

_KEY = "config.LOSS.bce_logits_multiple_output_single_target"
_REDUCTIONS = ("none", "mean", "sum")
#: target value of an entry that does not count
IGNORE = -1


@dataclass(kw_only=True, frozen=True)
class BCELogitsParams:
    """``config.LOSS.bce_logits_multiple_output_single_target`` (VISSL's keys)."""

    reduction: Annotated[str, OneOf(*_REDUCTIONS)] = "none"
    normalize_output: bool = False
    #: inferred by VISSL and not used by the loss
    world_size: int = 1


@register_loss("bce_logits_multiple_output_single_target")
class BCELogitsMultipleOutputSingleTargetLoss(nn.Module):
    """Sum over outputs of the masked binary cross entropy with logits against one target.

    Args:
        reduction: ``none`` (per-class mean over the valid samples, summed over classes,
            as VISSL), ``mean`` or ``sum`` over the valid entries.
        normalize_output: L2-normalise each output row before the sigmoid.
        world_size: accepted for VISSL configs (VISSL infers and does not use it).
    """

    Params = BCELogitsParams

    def __init__(
        self,
        reduction: str = BCELogitsParams.reduction,
        normalize_output: bool = BCELogitsParams.normalize_output,
        world_size: int = BCELogitsParams.world_size,
    ) -> None:
        super().__init__()
        p = parse(
            BCELogitsParams,
            {
                "reduction": reduction,
                "normalize_output": normalize_output,
                "world_size": world_size,
            },
            _KEY,
        )
        self.reduction = p.reduction
        self.normalize_output = p.normalize_output
        self.world_size = p.world_size

    @classmethod
    def from_config(cls, loss_config: Mapping[str, Any]) -> BCELogitsMultipleOutputSingleTargetLoss:
        """Build from ``LOSS.bce_logits_multiple_output_single_target``."""
        return cls(**vars(parse(BCELogitsParams, loss_config, _KEY)))

    def _one(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.ndim != 2 or target.shape != pred.shape:
            raise ValueError(
                "bce_logits_multiple_output_single_target: each output must be (B, C) like the "
                f"target; got output {tuple(pred.shape)} and target {tuple(target.shape)}. "
                "Multi-label targets come from (N, C) label arrays (1 present, 0 absent, "
                "-1 ignored) or targets_one_hot_default_collator."
            )
        if self.normalize_output:
            pred = F.normalize(pred, dim=1, p=2)
        valid = target != IGNORE
        per_entry = F.binary_cross_entropy_with_logits(
            pred, target.clamp(min=0).to(pred.dtype), reduction="none"
        )
        per_entry = torch.where(valid, per_entry, torch.zeros_like(per_entry))
        if self.reduction == "sum":
            return per_entry.sum()
        if self.reduction == "mean":
            return per_entry.sum() / valid.sum().clamp(min=1)
        per_class = valid.sum(dim=0).clamp(min=1)
        return (per_entry.sum(dim=0) / per_class).sum()

    def forward(
        self, output: torch.Tensor | Sequence[torch.Tensor], target: torch.Tensor
    ) -> torch.Tensor:
        """Sum over outputs of the masked BCE of each ``(B, C)`` output against ``target``."""
        outputs = [output] if isinstance(output, torch.Tensor) else list(output)
        if not outputs:
            raise ValueError("bce_logits_multiple_output_single_target: got no outputs.")
        if not torch.is_tensor(target):
            raise TypeError(f"the target must be a tensor, got {type(target).__name__}.")
        loss = self._one(outputs[0], target)
        for pred in outputs[1:]:
            loss = loss + self._one(pred, target)
        return loss

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, normalize_output={self.normalize_output}"

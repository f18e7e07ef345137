"""``cross_entropy_multiple_output_single_target``: summed cross entropy of several heads.

For one output tensor this is ordinary cross entropy; for a list of outputs (several
heads, or several evaluated layers in linear evaluation) it is the sum of the cross
entropy of every output against the same target. Targets may be class indices ``(B,)``
or per-class (soft, e.g. mixed-up or smoothed) vectors ``(B, C)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import nn

from vissl.config.params import OneOf, Positive, Unit, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss

_KEY = "config.LOSS.cross_entropy_multiple_output_single_target"
_REDUCTIONS = ("mean", "sum", "none")


def _reduce(per_sample: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return per_sample.mean()
    if reduction == "sum":
        return per_sample.sum()
    return per_sample


@dataclass(kw_only=True, frozen=True)
class CrossEntropyParams:
    """``config.LOSS.cross_entropy_multiple_output_single_target``."""

    #: per-class weights (null: none)
    weight: list[float] | None = None
    reduction: Annotated[str, OneOf(*_REDUCTIONS)] = "mean"
    ignore_index: int = -1
    normalize_output: bool = False
    temperature: Annotated[float, Positive] = 1.0
    label_smoothing: Annotated[float, Unit] = 0.0


@register_loss("cross_entropy_multiple_output_single_target")
class CrossEntropyMultipleOutputSingleTargetLoss(nn.Module):
    """Sum over outputs of the cross entropy against one target.

    Args:
        weight: optional per-class rescaling weights (hard targets only).
        reduction: ``mean`` | ``sum`` | ``none`` over the samples of each output.
        ignore_index: target value that is ignored (hard targets only).
        normalize_output: L2-normalise each output row before the softmax.
        temperature: the logits are divided by it.
        label_smoothing: amount of label smoothing in ``[0, 1]`` (hard targets only).
    """

    Params = CrossEntropyParams

    def __init__(
        self,
        weight: Sequence[float] | torch.Tensor | None = CrossEntropyParams.weight,
        reduction: str = CrossEntropyParams.reduction,
        ignore_index: int = CrossEntropyParams.ignore_index,
        normalize_output: bool = CrossEntropyParams.normalize_output,
        temperature: float = CrossEntropyParams.temperature,
        label_smoothing: float = CrossEntropyParams.label_smoothing,
    ) -> None:
        super().__init__()
        p = parse(
            CrossEntropyParams,
            {
                # a tensor (Python use) is checked below, by its shape
                "weight": None if isinstance(weight, torch.Tensor) else weight,
                "reduction": reduction,
                "ignore_index": ignore_index,
                "normalize_output": normalize_output,
                "temperature": temperature,
                "label_smoothing": label_smoothing,
            },
            _KEY,
        )
        self.reduction = p.reduction
        self.ignore_index = p.ignore_index
        self.normalize_output = p.normalize_output
        self.temperature = p.temperature
        self.label_smoothing = p.label_smoothing
        class_weight = None
        if weight is not None:
            class_weight = torch.as_tensor(weight, dtype=torch.float32)
            if class_weight.ndim != 1:
                raise ConfigError(
                    f"{_KEY}.weight must be a list of per-class weights, got {weight!r}.",
                    f"{_KEY}.weight",
                )
        self.weight: torch.Tensor | None
        self.register_buffer("weight", class_weight, persistent=False)

    @classmethod
    def from_config(
        cls, loss_config: Mapping[str, Any]
    ) -> CrossEntropyMultipleOutputSingleTargetLoss:
        """Build from ``LOSS.cross_entropy_multiple_output_single_target``."""
        return cls(**vars(parse(CrossEntropyParams, loss_config, _KEY)))

    def _one(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if pred.ndim != 2:
            raise ValueError(
                f"cross_entropy_multiple_output_single_target: each output must be (B, C), "
                f"got shape {tuple(pred.shape)}."
            )
        if self.normalize_output:
            pred = F.normalize(pred, dim=1, p=2)
        logits = pred / self.temperature
        if target.ndim == 2 and target.shape == logits.shape:
            # Soft (per-class) targets: -sum_c t_c log p_c per sample.
            log_probs = F.log_softmax(logits, dim=1)
            per_sample = -(log_probs * target.to(log_probs.dtype)).sum(dim=1)
            return _reduce(per_sample, self.reduction)
        if target.ndim != 1 or target.shape[0] != logits.shape[0]:
            raise ValueError(
                "cross_entropy_multiple_output_single_target: the target must be (B,) class "
                f"indices or (B, C) per-class scores; got target {tuple(target.shape)} for "
                f"output {tuple(logits.shape)}."
            )
        weight = self.weight
        if weight is not None and weight.device != logits.device:
            # Move the module's buffer once (e.g. when the loss was not moved with .to()).
            weight = weight.to(logits.device)
            self.weight = weight
        return F.cross_entropy(
            logits,
            target.long(),
            weight=weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
        )

    def forward(
        self, output: torch.Tensor | Sequence[torch.Tensor], target: torch.Tensor
    ) -> torch.Tensor:
        """Sum of the cross entropy of each output against ``target``.

        Args:
            output: a ``(B, C)`` tensor or a list of them.
            target: ``(B,)`` class indices or ``(B, C)`` per-class targets.
        """
        outputs = [output] if isinstance(output, torch.Tensor) else list(output)
        if not outputs:
            raise ValueError("cross_entropy_multiple_output_single_target: got no outputs.")
        if not torch.is_tensor(target):
            raise TypeError(f"the target must be a tensor, got {type(target).__name__}.")
        loss = self._one(outputs[0], target)
        for pred in outputs[1:]:
            loss = loss + self._one(pred, target)
        return loss

    def extra_repr(self) -> str:
        return (
            f"reduction={self.reduction!r}, ignore_index={self.ignore_index}, "
            f"normalize_output={self.normalize_output}, temperature={self.temperature}, "
            f"label_smoothing={self.label_smoothing}"
        )

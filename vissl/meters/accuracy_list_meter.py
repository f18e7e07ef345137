"""``accuracy_list_meter``: top-k accuracy of each model output (single-label targets)."""

from __future__ import annotations

import torch

from vissl.meters import register_meter
from vissl.meters._topk_list_meter import TopKListMeter


@register_meter("accuracy_list_meter")
class AccuracyListMeter(TopKListMeter):
    """Top-k accuracy, one meter per output.

    A sample counts as correct at ``k`` when its target class is among the ``k`` highest
    scores. ``(B, C)`` targets (one-hot, mixed-up) are reduced to their arg-max class.
    The value is ``{"top_k": {output: percent}}`` (see :attr:`TopKListMeter.value`).
    """

    NAME = "accuracy_list_meter"

    def _counts(
        self, output: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        if target.ndim == 2 and target.shape == output.shape:
            target = target.argmax(dim=1)
        elif target.ndim == 2 and target.shape[1] == 1:
            target = target[:, 0]
        if target.ndim != 1 or target.shape[0] != output.shape[0]:
            raise ValueError(
                f"{self.name}: target of shape {tuple(target.shape)} does not match the "
                f"output {tuple(output.shape)}; give (B,) class indices."
            )
        pred = self._topk_classes(output)
        correct = pred.eq(target.detach().long().view(-1, 1)).to(torch.float32)
        if weight is not None:
            correct = correct * weight.view(-1, 1)
        cumulative = correct.cumsum(dim=1).sum(dim=0)
        hits = torch.stack([cumulative[k - 1] for k in self._topk_values])
        return hits, float(output.shape[0]) if weight is None else weight.sum()

    def _ratio(self, hits: float, denom: float, k: int) -> float:
        return hits / denom

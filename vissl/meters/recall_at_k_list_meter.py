"""``recall_at_k_list_meter``: recall@k of each model output (single- or multi-label)."""

from __future__ import annotations

import torch

from vissl.meters import register_meter
from vissl.meters._topk_list_meter import TopKListMeter


@register_meter("recall_at_k_list_meter")
class RecallAtKListMeter(TopKListMeter):
    """Recall@k, one meter per output: correct labels among the top ``k`` / all labels.

    Example: targets ``[0 1 0 1 0]`` and scores ``[.06 .41 .04 .39 .1]`` give
    recall@1 = 1/2 and recall@3 = 2/2. Targets are ``(B,)`` class indices or ``(B, C)``
    one-hot / multi-label vectors.
    """

    NAME = "recall_at_k_list_meter"

    def _counts(
        self, output: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | float]:
        targets = self._one_hot_target(target, output)
        pred = self._topk_classes(output)
        hit = targets.gather(1, pred).clamp(max=1.0)
        if weight is not None:
            hit = hit * weight.view(-1, 1)
            targets = targets * weight.view(-1, 1)
        cumulative = hit.cumsum(dim=1).sum(dim=0)
        hits = torch.stack([cumulative[k - 1] for k in self._topk_values])
        return hits, targets.sum()

    def _ratio(self, hits: float, denom: float, k: int) -> float:
        return hits / denom

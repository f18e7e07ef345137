"""``siamese_concat_view`` head: the features of each image's ``num_towers`` patches,
concatenated into one row.

Siamese models (Jigsaw, PIRL's patch branch) run every patch through the same trunk as
an image of its own (``siamese_collator`` lays the ``num_towers`` patches of an image on
consecutive rows). This head regroups them: ``(N * num_towers, D)`` becomes
``(N, num_towers * D)``, row ``i`` holding the features of patches ``0 .. num_towers - 1``
of image ``i`` in order, so a following ``mlp`` sees the whole puzzle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from vissl.errors import ConfigError
from vissl.models.heads import register_model_head

_KEY = "config.MODEL.HEAD.PARAMS"


@register_model_head("siamese_concat_view")
class SiameseConcatView(nn.Module):
    """``(N * num_towers, D)`` (or ``(N * num_towers, D, 1, 1)``, or a list of one such
    tensor) -> ``(N, num_towers * D)``; other shapes are flattened per image.

    Args:
        model_config: config.MODEL (unused).
        num_towers: how many consecutive rows belong to one image (9 for Jigsaw).
    """

    def __init__(self, model_config: Mapping[str, Any] | None, num_towers: int) -> None:
        super().__init__()
        if isinstance(num_towers, bool) or not isinstance(num_towers, int) or num_towers < 1:
            raise ConfigError(
                f"{_KEY}: head 'siamese_concat_view' needs num_towers, a positive integer "
                f"(the number of patches per image, 9 for Jigsaw); got {num_towers!r}.",
                _KEY,
            )
        self.num_towers = num_towers

    def forward(self, batch: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        if not isinstance(batch, torch.Tensor):
            if len(batch) != 1:
                raise ValueError(
                    "siamese_concat_view expects a tensor or a list of one tensor; got a "
                    f"list of {len(batch)}."
                )
            batch = batch[0]
        rows = batch.shape[0]
        if rows % self.num_towers != 0:
            # a ValueError, not a ConfigError: the model's build-time width probe
            # (vissl.models.shape_check) runs 2 rows through the heads, and must skip
            # this head rather than report that as the user's mistake
            raise ValueError(
                f"{_KEY}: siamese_concat_view got {rows} rows, not a multiple of "
                f"num_towers={self.num_towers}: num_towers must equal the number of patches "
                "per image (num_patches of ImgPatchesFromTensor) and the batch must come "
                "from siamese_collator."
            )
        return batch.reshape(rows // self.num_towers, -1)

    def extra_repr(self) -> str:
        return f"num_towers={self.num_towers}"

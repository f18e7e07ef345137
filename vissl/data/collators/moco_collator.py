"""``moco_collator``: the query views in ``data``, the key views in ``data_momentum``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vissl.data.collators import register_collator
from vissl.data.collators._common import as_tensor, check_batch, check_tensor_data
from vissl.errors import ConfigError


@register_collator("moco_collator")
def moco_collator(batch: Sequence[dict[str, Any]]) -> dict[str, list[torch.Tensor]]:
    """Collate ``B`` samples of 2 views (e.g. from ``ImgReplicatePil``) for MoCo, like VISSL.

    Output::

        {"data": [Tensor(B, C, H, W)],           # view 0: the queries
         "data_momentum": [Tensor(B, C, H, W)],  # view 1: the keys (momentum encoder)
         "label": [Tensor(B)], "data_valid": [Tensor(B)], "data_idx": [Tensor(B)]}

    Row ``i`` of both tensors is sample ``i``; labels and indices are those of view 0.

    Raises:
        ConfigError: the samples do not hold exactly 2 views.
    """
    num_views = check_batch(batch, "moco_collator")
    if num_views != 2:
        raise ConfigError(
            f"moco_collator: each sample needs 2 views (a query and a key), got {num_views}. "
            "Replicate the image with {name: ImgReplicatePil, num_times: 2} first in "
            "config.DATA.TRAIN.TRANSFORMS.",
            "config.DATA.TRAIN.TRANSFORMS",
        )
    check_tensor_data(batch, "moco_collator")
    output: dict[str, list[torch.Tensor]] = {
        "data": [torch.stack([as_tensor(s["data"][0]) for s in batch])],
        "data_momentum": [torch.stack([as_tensor(s["data"][1]) for s in batch])],
    }
    for key in ("label", "data_valid", "data_idx"):
        output[key] = [torch.stack([as_tensor(s[key][0]) for s in batch])]
    return output

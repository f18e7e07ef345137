"""``simclr_collator``: all views of a batch in one tensor, view-major."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vissl.data.collators import register_collator
from vissl.data.collators._common import check_batch, check_tensor_data, view_major


@register_collator("simclr_collator")
def simclr_collator(batch: Sequence[dict[str, Any]]) -> dict[str, list[torch.Tensor]]:
    """Collate ``B`` samples of ``K`` views (e.g. from ``ImgReplicatePil``) like VISSL.

    Output (``N = K * B``, view-major: all first views, then all second views, ...)::

        {"data": [Tensor(N, C, H, W)],   # [img1_v0, ..., imgB_v0, img1_v1, ...]
         "label": [Tensor(N)], "data_valid": [Tensor(N)], "data_idx": [Tensor(N)]}

    so row ``v * B + i`` is view ``v`` of sample ``i``.
    """
    num_views = check_batch(batch, "simclr_collator")
    check_tensor_data(batch, "simclr_collator")
    keys = ("data", "label", "data_valid", "data_idx")
    return {key: [view_major(batch, key, num_views)] for key in keys}

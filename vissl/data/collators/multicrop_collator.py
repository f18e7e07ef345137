"""``multicrop_collator``: one tensor per crop (crops may differ in size), as for SwAV."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vissl.data.collators import register_collator
from vissl.data.collators._common import as_tensor, check_batch, check_tensor_data, view_major
from vissl.errors import ConfigError


@register_collator("multicrop_collator")
def multicrop_collator(
    batch: Sequence[dict[str, Any]], create_multidimensional_tensor: bool = False
) -> dict[str, Any]:
    """Collate ``B`` samples of ``K`` crops (e.g. from ``ImgPilToMultiCrop``) like VISSL.

    Output (``N = K * B``)::

        {"data": [[Tensor(B, C, H_0, W_0), ..., Tensor(B, C, H_{K-1}, W_{K-1})]],
         "label": [Tensor(N)], "data_valid": [Tensor(N)], "data_idx": [Tensor(N)]}

    ``data`` holds a single entry, the list of per-crop tensors in crop order; label,
    data_valid and data_idx are crop-major like ``simclr_collator`` (row ``k * B + i``).

    Args:
        batch: the samples.
        create_multidimensional_tensor: VISSL's MultiDimensionalTensor output; not
            supported (must be False).
    """
    if create_multidimensional_tensor:
        raise ConfigError(
            "multicrop_collator: create_multidimensional_tensor=True is not supported in "
            "vissl; remove it from COLLATE_FUNCTION_PARAMS.",
            "config.DATA.<split>.COLLATE_FUNCTION_PARAMS",
        )
    num_crops = check_batch(batch, "multicrop_collator")
    check_tensor_data(batch, "multicrop_collator")
    crops = [
        torch.stack([as_tensor(sample["data"][crop]) for sample in batch])
        for crop in range(num_crops)
    ]
    output: dict[str, Any] = {"data": [crops]}
    for key in ("label", "data_valid", "data_idx"):
        output[key] = [view_major(batch, key, num_crops)]
    return output

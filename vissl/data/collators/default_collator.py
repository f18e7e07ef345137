"""``default_collate``: torch's default collation of VISSL's sample dicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.utils.data import default_collate as torch_default_collate

from vissl.data.collators import register_collator
from vissl.data.collators._common import check_tensor_data


@register_collator("default_collate")
def default_collate(batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Collate entry-wise, as VISSL does with torch's ``default_collate``.

    Input: ``B`` samples ``{"data": [x_0, ..., x_{K-1}], "label": [...], ...}``.
    Output: ``{"data": [Tensor(B, ...) per entry k], "label": [Tensor(B) per label
    entry], "data_valid": [Tensor(B) per entry], "data_idx": [Tensor(B) per entry]}``.
    """
    if batch and isinstance(batch[0], dict) and "data" in batch[0]:
        check_tensor_data(batch, "default_collate")
    return torch_default_collate(list(batch))

"""Helpers shared by the collators."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from vissl.errors import ConfigError

REQUIRED_KEYS = ("data", "label", "data_valid", "data_idx")


def check_batch(batch: Sequence[dict[str, Any]], collator: str) -> int:
    """Check that every sample has the same number of views; return that number.

    Raises:
        ConfigError: a key is missing or the samples differ in their number of views.
    """
    key_path = "config.DATA.<split>.COLLATE_FUNCTION"
    if len(batch) == 0:
        raise ValueError(f"{collator}: cannot collate an empty batch")
    for key in REQUIRED_KEYS:
        if key not in batch[0]:
            raise ConfigError(
                f"{collator}: the samples have no {key!r} key (keys: {sorted(batch[0])}).",
                key_path,
            )
    num_views = len(batch[0]["data"])
    for sample in batch:
        for key in REQUIRED_KEYS:
            if len(sample[key]) != num_views:
                raise ConfigError(
                    f"{collator}: every sample needs the same number of views in 'data', "
                    f"'label', 'data_valid' and 'data_idx'; got {len(sample[key])} "
                    f"{key!r} entries for {num_views} views. With several data sources "
                    "or label sources, use default_collate.",
                    key_path,
                )
    return num_views


def check_tensor_data(batch: Sequence[dict[str, Any]], collator: str) -> None:
    """Raise a helpful error when the images were not converted to tensors.

    Raises:
        ConfigError: naming ``TRANSFORMS`` when a data entry is still a PIL image.
    """
    for entry in batch[0]["data"]:
        if isinstance(entry, Image.Image):
            key = "config.DATA.<split>.TRANSFORMS"
            raise ConfigError(
                f"{collator}: the samples hold PIL images; end {key} with "
                "{name: ToTensor} (and Normalize) so they can be batched.",
                key,
            )


def as_tensor(value: Any) -> torch.Tensor:
    """A tensor from a label, index or flag (ints, numpy values, nested lists)."""
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def view_major(batch: Sequence[dict[str, Any]], key: str, num_views: int) -> torch.Tensor:
    """``[s0.v0, s1.v0, ..., s0.v1, s1.v1, ...]`` of ``key``, stacked into one tensor."""
    return torch.stack(
        [as_tensor(sample[key][view]) for view in range(num_views) for sample in batch]
    )

"""``msn_collator``: MSN's batch, the target view, the masked anchor views and the focal views.

Each sample holds ``K`` crops (``ImgPilToMultiCrop``): the crops of the largest size come
first, and the first of them is the TARGET view (seen whole by the target encoder); the
other crops of that size are the random-masked ANCHOR views (MSN: 1), and the smaller crops
the FOCAL views (MSN's focal masking: a small crop of the image, 96 px for 224, MSN: 10).
A patch-masking transform (``RandomPatchMasking``, last in the chain) gives the anchors'
masks; it may mask every crop, the crops of the largest size, or (with ``indices``) the
anchor crops only: the collator keeps the anchors' masks. Output, for ``B`` samples, every
tensor crop-major (crop 1 of every sample, then crop 2, ...)::

    {"target_views": [Tensor(B, C, H, W)],
     "anchor_views": [Tensor(R * B, C, H, W)],
     "focal_views": [Tensor(F * B, C, h, w)],       # absent without focal crops
     "mask": [Tensor(R * B, H / p, W / p) bool],    # the anchor views' masks
     "label": [Tensor(K * B)], "data_valid": [Tensor(K * B)], "data_idx": [Tensor(K * B)]}

The data set seeds each sample's transforms from (SEED_VALUE, epoch, index), so the crops
and the masks are the same after a resume and with any number of workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vissl.data.collators import register_collator
from vissl.data.collators._common import as_tensor, check_batch, check_tensor_data, view_major
from vissl.errors import ConfigError

_KEY = "config.DATA.<split>.COLLATE_FUNCTION"
_NAME = "msn_collator"


def _layout(sizes: list[tuple[int, ...]]) -> tuple[list[int], list[int]]:
    """(the anchor crops, the focal crops): crop 0 is the target."""
    largest = max(size[-2] * size[-1] for size in sizes)
    large = [k for k, size in enumerate(sizes) if size[-2] * size[-1] == largest]
    if large != list(range(len(large))) or len(large) < 2:
        raise ConfigError(
            f"{_NAME}: the crops have sizes {sizes}; MSN needs the target view first, then at "
            "least one anchor view of the same (largest) size, then the smaller focal crops, e.g. "
            "ImgPilToMultiCrop with size_crops [224, 96], num_crops [2, 10].",
            _KEY,
        )
    focal = [k for k in range(len(sizes)) if k not in large]
    if len({sizes[k] for k in focal}) > 1:
        raise ConfigError(
            f"{_NAME}: the focal crops have several sizes {sorted({sizes[k] for k in focal})}; "
            "they are batched as one tensor, so give them one size in ImgPilToMultiCrop.",
            _KEY,
        )
    return large[1:], focal


@register_collator("msn_collator")
def msn_collator(batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Collate ``B`` samples of ``K`` crops and their masks (see the module docstring).

    Raises:
        ConfigError: the crops do not start with a target and an anchor of the largest
            size, the focal crops differ in size, or the masks are missing or do not match
            the crops.
    """
    num_crops = check_batch(batch, _NAME)
    check_tensor_data(batch, _NAME)
    if "mask" not in batch[0]:
        raise ConfigError(
            f"{_NAME}: the samples have no 'mask'; end config.DATA.TRAIN.TRANSFORMS with "
            "{name: RandomPatchMasking, mask_ratio: ..., patch_size: <the trunk's "
            "PATCH_SIZE>} (MSN masks its anchor views).",
            _KEY,
        )
    sizes = [tuple(as_tensor(crop).shape) for crop in batch[0]["data"]]
    anchors, focal = _layout(sizes)
    num_masks = len(batch[0]["mask"])
    if num_masks == num_crops or num_masks == len(anchors) + 1:
        mask_of = {k: k for k in anchors}
    elif num_masks == len(anchors):
        mask_of = {k: i for i, k in enumerate(anchors)}
    else:
        raise ConfigError(
            f"{_NAME}: each sample has {num_masks} masks for {num_crops} crops "
            f"({len(anchors)} anchors): the masking transform must come after "
            "ImgPilToMultiCrop and mask every crop, the crops of the largest size, or the "
            "anchor crops only (indices).",
            _KEY,
        )

    def stack(crops: list[int], key: str, slot: dict[int, int] | None = None) -> torch.Tensor:
        return torch.stack(
            [
                as_tensor(sample[key][k if slot is None else slot[k]])
                for k in crops
                for sample in batch
            ]
        )

    output: dict[str, Any] = {
        "target_views": [stack([0], "data")],
        "anchor_views": [stack(anchors, "data")],
        "mask": [stack(anchors, "mask", mask_of).bool()],
    }
    if focal:
        output["focal_views"] = [stack(focal, "data")]
    for key in ("label", "data_valid", "data_idx"):
        output[key] = [view_major(batch, key, num_crops)]
    return output

"""``msn_collator``: MSN's batch, the target view, the masked anchor views and the focal views.

Each sample holds ``K`` crops (``ImgPilToMultiCrop``): the crops of the largest size come
first, and the first of them is the TARGET view (seen whole by the target encoder); the
other crops of that size are the random-masked ANCHOR views (MSN: 1), and the smaller crops
the FOCAL views (MSN's focal masking: a small crop of the image, 96 px for 224, MSN: 10).
A patch-masking transform (``RandomPatchMasking``, last in the chain) gives the masks.
MSN drops patches of the anchor views of the target's size only (facebookresearch/msn
``src/deit.py``: ``patch_drop`` applies to the first group of crops, its 224 px
``rand_views``, and is 0 for the 96 px focal views): mask the anchor crops
(``indices: [1, ..., R]``, MSN's setting) or the crops of the largest size, the target's
too (its mask is not used); the focal views are seen whole. Masking the focal views too
(``indices: [1, ..., K - 1]``, or every crop) is an ablation (lightly's MSN example does
it): the collator then also returns the focal views' masks, ``focal_mask``. Which crops the
masks belong to is read from their order and their grids (a mask's grid is its crop's size
over the patch size). Output, for ``B`` samples, every tensor crop-major (crop 1 of every
sample, then crop 2, ...)::

    {"target_views": [Tensor(B, C, H, W)],
     "anchor_views": [Tensor(R * B, C, H, W)],
     "focal_views": [Tensor(F * B, C, h, w)],       # absent without focal crops
     "mask": [Tensor(R * B, H / p, W / p) bool],    # the anchor views' masks
     "focal_mask": [Tensor(F * B, h / p, w / p) bool],  # only when the focal crops are masked
     "label": [Tensor(K * B)], "data_valid": [Tensor(K * B)], "data_idx": [Tensor(K * B)]}

In that ablation the model gets the focal views' masks as its trunk's ``mask`` argument
through ``MULTI_INPUT_HEAD_MAPPING``'s ``additional_keys: {mask: focal_mask}`` (and
``INPUT_KEY_NAMES`` lists ``focal_mask``; ``msn_loss`` checks the three agree).

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


def _masked_crops(
    sizes: list[tuple[int, ...]], grids: list[tuple[int, ...]], anchors: list[int], focal: list[int]
) -> list[int] | None:
    """The crops the masks belong to, in mask order: every crop, every crop but the target,
    the crops of the largest size, or the anchors only (the first layout whose crops' sizes
    fit the masks' grids with one patch size); None if none fits."""
    layouts = [
        list(range(len(sizes))),
        [*anchors, *focal],
        [0, *anchors],
        anchors,
    ]
    for crops in layouts:
        if len(crops) != len(grids):
            continue
        ratios = set()
        for k, grid in zip(crops, grids):
            height, width = sizes[k][-2:]
            if len(grid) != 2 or height % grid[0] or width % grid[1]:
                ratios.add((-1, -1))
                break
            ratios.add((height // grid[0], width // grid[1]))
        if len(ratios) == 1:
            return crops
    return None


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
            "PATCH_SIZE>, indices: [1]} (MSN masks its anchor views, crops 1..R; the focal "
            "views stay whole).",
            _KEY,
        )
    sizes = [tuple(as_tensor(crop).shape) for crop in batch[0]["data"]]
    anchors, focal = _layout(sizes)
    grids = [tuple(as_tensor(mask).shape) for mask in batch[0]["mask"]]
    masked = _masked_crops(sizes, grids, anchors, focal)
    if masked is None:
        raise ConfigError(
            f"{_NAME}: each sample has {len(grids)} masks (grids {grids}) for {num_crops} "
            f"crops of sizes {[s[-2:] for s in sizes]} ({len(anchors)} anchors, {len(focal)} "
            "focal): the masking transform must come after ImgPilToMultiCrop and mask the "
            "anchor crops (indices [1, ..., R], MSN's), the crops of the largest size, or "
            "(an ablation) every crop but the target or every crop, with one patch_size.",
            _KEY,
        )
    mask_of = {k: i for i, k in enumerate(masked)}

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
        if all(k in mask_of for k in focal):
            output["focal_mask"] = [stack(focal, "mask", mask_of).bool()]
    for key in ("label", "data_valid", "data_idx"):
        output[key] = [view_major(batch, key, num_crops)]
    return output

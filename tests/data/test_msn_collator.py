"""msn_collator: the target view (crop 0), the masked anchor views (the other crops of the
largest size), the focal views (the smaller crops), the anchors' masks and (the
focal-masking ablation) the focal views', crop-major; masks of the anchors only (MSN's), of
the large crops, of every crop but the target or of every crop, told apart by their grids;
errors that name what to fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vissl.data import get_collator
from vissl.errors import ConfigError

COLLATE = get_collator("msn_collator")


def _mask(size: int, value: int) -> torch.Tensor:
    """A (size / 4)-square mask (4 px patches) with ``value`` patches masked (at most all)."""
    side = size // 4
    return torch.arange(side * side).reshape(side, side) < value


def _batch(n: int, sizes: list[int], masks_for: list[int] | None = None) -> list[dict[str, Any]]:
    """Pixel values and mask sums encode (sample, crop) so the layout can be checked."""
    crops = range(len(sizes))
    masked = list(crops) if masks_for is None else masks_for
    return [
        {
            "data": [torch.full((3, s, s), 10.0 * i + c) for c, s in zip(crops, sizes)],
            "mask": [_mask(sizes[c], (i + c) % 5) for c in masked],
            "label": [100 + i] * len(sizes),
            "data_valid": [1] * len(sizes),
            "data_idx": [i] * len(sizes),
        }
        for i in range(n)
    ]


def test_layout_target_anchors_focal_views_crop_major() -> None:
    out = COLLATE(_batch(3, [8, 8, 8, 4, 4]))
    assert set(out) == {
        "target_views", "anchor_views", "focal_views", "mask", "focal_mask", "label",
        "data_valid", "data_idx",
    }  # fmt: skip
    (target,), (anchors,), (focal,) = out["target_views"], out["anchor_views"], out["focal_views"]
    assert target[:, 0, 0, 0].tolist() == [0, 10, 20]
    # row m * B + i is anchor m of sample i
    assert anchors[:, 0, 0, 0].tolist() == [1, 11, 21, 2, 12, 22]
    assert focal[:, 0, 0, 0].tolist() == [3, 13, 23, 4, 14, 24]
    (mask,) = out["mask"]
    assert mask.dtype == torch.bool and mask.shape == (6, 2, 2)
    assert mask.reshape(6, -1).sum(dim=1).tolist() == [
        min((i + c) % 5, 4) for c in (1, 2) for i in range(3)
    ]
    (focal_mask,) = out["focal_mask"]
    assert focal_mask.dtype == torch.bool and focal_mask.shape == (6, 1, 1)
    assert focal_mask.reshape(6).tolist() == [(i + c) % 5 > 0 for c in (3, 4) for i in range(3)]
    assert out["data_idx"][0].tolist() == [0, 1, 2] * 5


def test_focal_masking_ablation_and_the_grids_tell_the_layouts_apart() -> None:
    everything = COLLATE(_batch(2, [8, 8, 4, 4]))
    # the ablation's indices [1, ..., K - 1]: the anchor's and the focal views' masks
    msn = COLLATE(_batch(2, [8, 8, 4, 4], masks_for=[1, 2, 3]))
    for key in ("mask", "focal_mask"):
        assert torch.equal(msn[key][0], everything[key][0])
    # one focal crop: two masks are the target's and the anchor's (equal grids) or the
    # anchor's and the focal view's (a smaller grid)
    large = COLLATE(_batch(2, [8, 8, 4], masks_for=[0, 1]))
    assert "focal_mask" not in large
    focal = COLLATE(_batch(2, [8, 8, 4], masks_for=[1, 2]))
    assert torch.equal(focal["mask"][0], large["mask"][0])
    assert focal["focal_mask"][0].shape == (2, 1, 1)


def test_masks_of_the_anchors_only_as_msn_or_of_the_large_crops() -> None:
    """MSN's layout (facebookresearch/msn deit.py masks the 224 px rand_views only): the
    anchors' masks, the focal views whole, no focal_mask."""
    expected = COLLATE(_batch(2, [8, 8, 4]))["mask"][0]
    large = COLLATE(_batch(2, [8, 8, 4], masks_for=[0, 1]))
    assert torch.equal(large["mask"][0], expected)
    anchors_only = COLLATE(_batch(2, [8, 8, 4], masks_for=[1]))
    assert torch.equal(anchors_only["mask"][0], expected)
    assert "focal_mask" not in large and "focal_mask" not in anchors_only  # focal unmasked
    out = COLLATE(_batch(2, [8, 8]))
    assert "focal_views" not in out and out["anchor_views"][0].shape == (2, 3, 8, 8)


def test_errors_say_what_to_fix() -> None:
    no_mask = _batch(2, [8, 8, 4])
    for sample in no_mask:
        del sample["mask"]
    with pytest.raises(ConfigError, match="RandomPatchMasking"):
        COLLATE(no_mask)
    with pytest.raises(ConfigError, match=r"4 masks \(grids .*\) for 5 crops"):
        COLLATE(_batch(2, [8, 8, 4, 4, 4], masks_for=[0, 1, 2, 3]))
    with pytest.raises(ConfigError, match="target view first"):
        COLLATE(_batch(2, [8, 4, 4]))
    with pytest.raises(ConfigError, match="several sizes"):
        COLLATE(_batch(2, [8, 8, 4, 6]))

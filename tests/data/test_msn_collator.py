"""msn_collator: the target view (crop 0), the masked anchor views (the other crops of the
largest size), the focal views (the smaller crops), the anchors' masks, crop-major; masks of
every crop, of the large crops or of the anchors only; errors that name what to fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vissl.data import get_collator
from vissl.errors import ConfigError

COLLATE = get_collator("msn_collator")


def _batch(n: int, sizes: list[int], masks_for: list[int] | None = None) -> list[dict[str, Any]]:
    """Pixel values and mask sums encode (sample, crop) so the layout can be checked."""
    crops = range(len(sizes))
    masked = list(crops) if masks_for is None else masks_for
    return [
        {
            "data": [torch.full((3, s, s), 10.0 * i + c) for c, s in zip(crops, sizes)],
            "mask": [torch.arange(4).reshape(2, 2) < (i + c) % 5 for c in masked],
            "label": [100 + i] * len(sizes),
            "data_valid": [1] * len(sizes),
            "data_idx": [i] * len(sizes),
        }
        for i in range(n)
    ]


def test_layout_target_anchors_focal_views_crop_major() -> None:
    out = COLLATE(_batch(3, [8, 8, 8, 4, 4]))
    assert set(out) == {
        "target_views", "anchor_views", "focal_views", "mask", "label", "data_valid", "data_idx",
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
    assert out["data_idx"][0].tolist() == [0, 1, 2] * 5


def test_masks_of_the_large_crops_or_of_the_anchors_only() -> None:
    expected = COLLATE(_batch(2, [8, 8, 4]))["mask"][0]
    large = COLLATE(_batch(2, [8, 8, 4], masks_for=[0, 1]))["mask"][0]
    assert torch.equal(large, expected)
    anchors_only = _batch(2, [8, 8, 4], masks_for=[1])
    assert torch.equal(COLLATE(anchors_only)["mask"][0], expected)
    out = COLLATE(_batch(2, [8, 8]))
    assert "focal_views" not in out and out["anchor_views"][0].shape == (2, 3, 8, 8)


def test_errors_say_what_to_fix() -> None:
    no_mask = _batch(2, [8, 8, 4])
    for sample in no_mask:
        del sample["mask"]
    with pytest.raises(ConfigError, match="RandomPatchMasking"):
        COLLATE(no_mask)
    with pytest.raises(ConfigError, match="4 masks for 5 crops"):
        COLLATE(_batch(2, [8, 8, 4, 4, 4], masks_for=[0, 1, 2, 3]))
    with pytest.raises(ConfigError, match="target view first"):
        COLLATE(_batch(2, [8, 4, 4]))
    with pytest.raises(ConfigError, match="several sizes"):
        COLLATE(_batch(2, [8, 8, 4, 6]))

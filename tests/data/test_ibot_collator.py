"""ibot_multicrop_masking_collator: VISSL's iBOT layout (global views, local views, the
global views' masks, crop-major), masks of every crop or of the global crops only, and the
errors that name what to fix."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vissl.data import get_collator
from vissl.errors import ConfigError

COLLATE = get_collator("ibot_multicrop_masking_collator")


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


def test_layout_is_vissls_crop_major_global_and_local_views() -> None:
    out = COLLATE(_batch(3, [8, 8, 4, 4, 4]))
    assert set(out) == {"global_views", "local_views", "mask", "label", "data_valid", "data_idx"}
    (glob,), (local,), (mask,) = out["global_views"], out["local_views"], out["mask"]
    assert glob.shape == (6, 3, 8, 8) and local.shape == (9, 3, 4, 4)
    # row c * B + i is crop c of sample i
    assert glob[:, 0, 0, 0].tolist() == [0, 10, 20, 1, 11, 21]
    assert local[:, 0, 0, 0].tolist() == [2, 12, 22, 3, 13, 23, 4, 14, 24]
    assert mask.dtype == torch.bool and mask.shape == (6, 2, 2)
    # the global crops' masks only, in the same order as global_views
    assert mask.reshape(6, -1).sum(dim=1).tolist() == [
        min((i + c) % 5, 4) for c in (0, 1) for i in range(3)
    ]
    assert out["label"][0].tolist() == [100, 101, 102] * 5
    assert out["data_idx"][0].tolist() == [0, 1, 2] * 5


def test_masks_of_the_global_crops_only_and_no_local_crops() -> None:
    out = COLLATE(_batch(2, [8, 8, 4], masks_for=[0, 1]))
    assert out["mask"][0].reshape(4, -1).sum(dim=1).tolist() == [0, 1, 1, 2]
    out = COLLATE(_batch(2, [8, 8]))
    assert "local_views" not in out and out["global_views"][0].shape == (4, 3, 8, 8)


def test_errors_say_what_to_fix() -> None:
    no_mask = _batch(2, [8, 8, 4])
    for sample in no_mask:
        del sample["mask"]
    with pytest.raises(ConfigError, match="MaskedImageModeling"):
        COLLATE(no_mask)
    with pytest.raises(ConfigError, match="masks for 3 crops"):
        COLLATE(_batch(2, [8, 8, 4], masks_for=[0]))
    with pytest.raises(ConfigError, match="several sizes"):
        COLLATE(_batch(2, [8, 8, 4, 6]))

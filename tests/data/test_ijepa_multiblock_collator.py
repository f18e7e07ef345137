"""ijepa_multiblock_collator: the blocks have the drawn size and stay in the grid, the
context never shows a target patch, every context and every block of a batch are cut to
the batch's smallest (their first patches in row-major order), the sizes follow the scale
and aspect-ratio ranges, the draws come from the batch's seed only, and bad parameters
name their key."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vissl.data.collators.ijepa_multiblock_collator import (
    block_size,
    context_block,
    ijepa_multiblock_collator,
    keep_first,
    multiblock_masks,
    multiblock_settings,
    place_block,
)
from vissl.data.samplers import SeededSamples
from vissl.errors import ConfigError

PAPER = multiblock_settings({})


def _samples(n: int = 6, size: int = 32, seed: int | None = 7) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    samples = [
        {
            "data": [torch.randn(3, size, size)],
            "label": [i],
            "data_valid": [1],
            "data_idx": [i],
        }
        for i in range(n)
    ]
    return samples if seed is None else SeededSamples(samples, seed)


def _rectangle(mask: torch.Tensor) -> tuple[int, int]:
    rows = torch.nonzero(mask.any(1)).flatten()
    cols = torch.nonzero(mask.any(0)).flatten()
    h, w = int(rows[-1] - rows[0] + 1), int(cols[-1] - cols[0] + 1)
    assert int(mask.sum()) == h * w  # a full rectangle
    return h, w


def test_paper_defaults() -> None:
    assert PAPER.num_target_blocks == 4
    assert PAPER.target_scale == (0.15, 0.2) and PAPER.target_aspect_ratio == (0.75, 1.5)
    assert PAPER.context_scale == (0.85, 1.0) and PAPER.context_aspect_ratio == (1.0, 1.0)
    assert not PAPER.allow_overlap


def test_block_sizes_follow_the_scale_and_aspect_ranges() -> None:
    g = torch.Generator().manual_seed(0)
    grid = (14, 14)
    for _ in range(200):
        h, w = block_size(grid, (0.15, 0.2), (0.75, 1.5), g)
        area = (h, w)
        # int(196 * s) in [29, 39] patches, rounded to a rectangle of aspect 0.75-1.5
        assert 20 <= h * w <= 48, area
        assert 0.75 / 1.5 <= h / w <= 1.5 * 1.5, area
        mask = place_block(grid, (h, w), g)
        assert _rectangle(mask) == (h, w)
    sizes = {block_size(grid, (0.85, 1.0), (1.0, 1.0), g) for _ in range(50)}
    assert all(h == w and 13 <= h <= 14 for h, w in sizes)  # sqrt(167 .. 196)
    assert (14, 14) in sizes  # a block may span the whole grid


def test_every_position_is_reachable() -> None:
    g = torch.Generator().manual_seed(0)
    corners = {tuple(torch.nonzero(place_block((4, 5), (2, 2), g))[0].tolist()) for _ in range(400)}
    assert corners == {(r, c) for r in range(3) for c in range(4)}


def test_the_batch_masks() -> None:
    g = torch.Generator().manual_seed(3)
    context, targets = multiblock_masks(16, (14, 14), PAPER, g)
    assert context.shape == (16, 14, 14) and targets.shape == (16, 4, 14, 14)
    assert not (context.unsqueeze(1) & targets).any()  # the context shows no target patch
    counts = context.flatten(1).sum(1)
    assert len(set(counts.tolist())) == 1 and int(counts[0]) >= PAPER.min_context_patches
    block_counts = targets.flatten(2).sum(2)
    assert len(set(block_counts.tolist()[0] + block_counts.flatten().tolist())) == 1
    assert 20 <= int(block_counts[0, 0]) <= 48


def test_truncation_keeps_the_first_patches_in_row_major_order() -> None:
    mask = torch.tensor([[False, True, True], [True, False, True]])
    assert keep_first(mask, 3).tolist() == [[False, True, True], [True, False, False]]
    # the batch's smallest block sets the count; the others lose their last patches
    g = torch.Generator().manual_seed(0)
    settings = multiblock_settings({"target_scale": [0.1, 0.3], "min_context_patches": 1})
    context, targets = multiblock_masks(8, (10, 10), settings, g)
    k = int(targets[0, 0].sum())
    for row in targets:
        for block in row:
            patches = torch.nonzero(block.flatten()).flatten()
            assert len(patches) == k
    del context


def test_context_retries_then_relaxes_the_constraints() -> None:
    g = torch.Generator().manual_seed(0)
    grid = (4, 4)
    everything = torch.ones(4, 4, dtype=torch.bool)
    half = torch.zeros(4, 4, dtype=torch.bool)
    half[:2] = True
    settings = multiblock_settings({"min_context_patches": 7, "max_tries": 3})
    # the second target covers the grid: it stops constraining, the first still does
    block = context_block(grid, (4, 4), [half, everything], settings, g)
    assert block.tolist() == (~half).tolist()
    overlap = multiblock_settings({"allow_overlap": True})
    assert context_block(grid, (4, 4), [everything], overlap, g).all()


def test_a_context_must_keep_more_than_min_context_patches() -> None:
    """I-JEPA's ``valid_mask = len(mask) > self.min_keep``: a context of exactly
    min_context_patches patches is drawn again (then relaxed), one more is kept."""
    g = torch.Generator().manual_seed(0)
    grid = (4, 4)
    target = torch.zeros(4, 4, dtype=torch.bool)
    target[:2] = True  # the context block (the whole grid) keeps 8 patches off it
    for minimum, kept in [(8, 16), (7, 8)]:
        settings = multiblock_settings({"min_context_patches": minimum, "max_tries": 3})
        block = context_block(grid, (4, 4), [target], settings, g)
        assert int(block.sum()) == kept, minimum
    # every context of a batch has more than min_context_patches patches
    settings = multiblock_settings({"min_context_patches": 150})
    context, _ = multiblock_masks(8, (14, 14), settings, torch.Generator().manual_seed(2))
    assert int(context.flatten(1).sum(1).min()) > 150


def test_collator_output_and_draws_from_the_batch_seed_only() -> None:
    params = {"patch_size": 4, "min_context_patches": 4}
    out = ijepa_multiblock_collator(_samples(seed=7), **params)
    assert out["data"][0].shape == (6, 3, 32, 32)
    assert out["mask"][0].shape == (6, 8, 8) and out["mask"][0].dtype == torch.bool
    assert out["target_masks"][0].shape == (6, 4, 8, 8)
    assert out["data_idx"][0].tolist() == list(range(6))
    # the mask is True off the context: the context patches never include a target patch
    assert not ((~out["mask"][0]).unsqueeze(1) & out["target_masks"][0]).any()
    torch.manual_seed(123)
    again = ijepa_multiblock_collator(_samples(seed=7), **params)
    other = ijepa_multiblock_collator(_samples(seed=8), **params)
    assert torch.equal(out["mask"][0], again["mask"][0])
    assert torch.equal(out["target_masks"][0], again["target_masks"][0])
    assert not torch.equal(out["target_masks"][0], other["target_masks"][0])
    # a hand-made list is seeded from its samples' indices: still deterministic
    a = ijepa_multiblock_collator(_samples(seed=None), **params)
    b = ijepa_multiblock_collator(_samples(seed=None), **params)
    assert torch.equal(a["target_masks"][0], b["target_masks"][0])


def test_context_covers_most_of_the_image_at_the_paper_settings() -> None:
    """On ViT-*/16 at 224 px (14 x 14): the context keeps a fair share of the grid."""
    out = ijepa_multiblock_collator(_samples(n=8, size=224), patch_size=16)
    kept = int((~out["mask"][0][0]).sum())
    assert 10 <= kept < 196
    per_block = out["target_masks"][0].flatten(2).sum(2)
    assert 20 <= int(per_block[0, 0]) <= 39  # int(196 * 0.15 .. 0.2), a few cut off


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"num_target_blocks": 0}, "num_target_blocks"),
        ({"target_scale": [0.3, 0.2]}, "target_scale"),
        ({"context_scale": [0.9, 1.2]}, "context_scale"),
        ({"target_aspect_ratio": 1.0}, "target_aspect_ratio"),
        ({"allow_overlap": "no"}, "allow_overlap"),
        ({"mask_ratio": 0.5}, "mask_ratio"),
    ],
)
def test_bad_parameters_name_their_key(params: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        ijepa_multiblock_collator(_samples(), **params)
    assert err.value.key_path.endswith(key)


def test_images_must_be_whole_patches_and_one_per_sample() -> None:
    with pytest.raises(ConfigError, match="whole number of 5 px"):
        ijepa_multiblock_collator(_samples(), patch_size=5)
    two = _samples(seed=None)
    for s in two:
        for key in ("data", "label", "data_valid", "data_idx"):
            s[key] = s[key] * 2
    with pytest.raises(ConfigError, match="one image"):
        ijepa_multiblock_collator(two, patch_size=4)

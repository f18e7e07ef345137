"""Patch masks: MAE's random masking and BEiT/iBOT's block-wise masking (counts, ratios,
shapes), the transforms' config errors, the sample wrapper's dict outputs, the collated
batch, and masks drawn again identically from (seed, epoch, index) by the data set."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from vissl.data import build_dataset
from vissl.data.collators.default_collator import default_collate
from vissl.data.masking import block_mask, num_kept, random_mask
from vissl.data.ssl_dataset import sample_seed
from vissl.data.ssl_transforms import build_transforms
from vissl.data.ssl_transforms.masked_image_modeling import MaskedImageModeling, RandomPatchMasking
from vissl.data.ssl_transforms.seeding import seeded_rng
from vissl.errors import ConfigError
from vissl.utils.hydra_config import hydra_compose_and_validate


@pytest.mark.parametrize(("grid", "ratio"), [((14, 14), 0.75), ((4, 4), 0.5), ((3, 5), 0.9)])
def test_random_mask_hides_a_fixed_count(grid: tuple[int, int], ratio: float) -> None:
    length = grid[0] * grid[1]
    keep = max(1, int(length * (1 - ratio)))  # MAE's len_keep
    for _ in range(20):
        mask = random_mask(grid, ratio)
        assert mask.shape == grid and mask.dtype == torch.bool
        assert int((~mask).sum()) == keep == num_kept(length, ratio)


def test_random_mask_is_uniform_over_positions() -> None:
    torch.manual_seed(0)
    freq = torch.stack([random_mask((4, 4), 0.75) for _ in range(4000)]).float().mean(0)
    # each position masked with probability 12 / 16; 4000 draws: std 0.007
    assert torch.allclose(freq, torch.full((4, 4), 0.75), atol=0.03)


def test_block_mask_covers_about_the_target_with_rectangles() -> None:
    torch.manual_seed(0)
    counts = []
    for _ in range(200):
        mask = block_mask((14, 14), 59)  # iBOT's 0.3 of a 14 x 14 grid
        counts.append(int(mask.sum()))
    assert max(counts) <= 59
    assert sum(counts) / len(counts) > 0.9 * 59  # a few short of the target at most


def ibot_block_mask(
    grid: tuple[int, int], high: int, log_aspect: tuple[float, float]
) -> torch.Tensor:
    """iBOT's ``ImageFolderMask.__getitem__`` (pred_shape block), line by line, with its
    ``random.uniform`` / ``random.randint`` drawn from torch's global generator in the same
    order (uniform(a, b) = a + (b - a) U; randint(a, b) includes b)."""
    big_h, big_w = grid
    mask = torch.zeros(big_h, big_w, dtype=torch.bool)
    mask_count = 0
    while mask_count < high:
        max_mask_patches = high - mask_count
        delta = 0
        for _attempt in range(10):
            low = (min(big_h, big_w) // 3) ** 2
            target_area = low + (max_mask_patches - low) * float(torch.rand(()))
            lo, hi = log_aspect
            aspect_ratio = math.exp(lo + (hi - lo) * float(torch.rand(())))
            h = round(math.sqrt(target_area * aspect_ratio))
            w = round(math.sqrt(target_area / aspect_ratio))
            if w < big_w and h < big_h:
                top = int(torch.randint(0, big_h - h + 1, ()))
                left = int(torch.randint(0, big_w - w + 1, ()))
                num_masked = int(mask[top : top + h, left : left + w].sum())
                if 0 < h * w - num_masked <= max_mask_patches:
                    delta = h * w - num_masked
                    mask[top : top + h, left : left + w] = True
            if delta > 0:
                break
        if delta == 0:
            break
        mask_count += delta
    return mask


@pytest.mark.parametrize(("grid", "ratio"), [((14, 14), 0.3), ((4, 4), 0.5), ((3, 6), 0.7)])
def test_block_mask_is_ibots_draw_for_draw(grid: tuple[int, int], ratio: float) -> None:
    """The same masks as iBOT's loader for the same random numbers: blocks strictly
    smaller than the grid, the area uniform between iBOT's low and the patches left even
    when low is the larger."""
    log_aspect = (math.log(0.3), math.log(1 / 0.3))
    num = int(grid[0] * grid[1] * ratio)
    for seed in range(60):
        torch.manual_seed(seed)
        ours = block_mask(grid, num, log_aspect_ratio=log_aspect)
        torch.manual_seed(seed)
        assert torch.equal(ours, ibot_block_mask(grid, num, log_aspect)), seed


def test_block_mask_blocks_never_span_the_grid() -> None:
    """iBOT's ``w < W and h < H``: a 4 x 4 block on a 4 x 4 grid is never placed."""
    torch.manual_seed(0)
    whole = block_mask((4, 4), 16, min_num_patches=16, log_aspect_ratio=(0.0, 0.0))
    assert not whole.any()
    # a 3 x 3 block fits: the rounds cover the target with blocks of at most 3 x 3
    assert int(block_mask((4, 4), 9, min_num_patches=9, log_aspect_ratio=(0.0, 0.0)).sum()) == 9


def test_block_mask_is_made_of_blocks_not_scattered_patches() -> None:
    """The masked patches of a block mask have masked neighbours (unlike a random mask)."""
    torch.manual_seed(1)

    def isolated(mask: torch.Tensor) -> int:
        m = torch.nn.functional.pad(mask.float()[None, None], (1, 1, 1, 1))[0, 0]
        neighbours = m[:-2, 1:-1] + m[2:, 1:-1] + m[1:-1, :-2] + m[1:-1, 2:]
        return int(((neighbours == 0) & mask).sum())

    blocks = sum(isolated(block_mask((14, 14), 59)) for _ in range(50))
    scattered = sum(isolated(random_mask((14, 14), 0.3)) for _ in range(50))
    assert blocks * 10 < scattered  # a few 1 x 1 blocks fill the last patches


def test_masked_image_modeling_ratio_draws() -> None:
    """VISSL's keys: a mean picked per image, the ratio uniform in mean +- var."""
    torch.manual_seed(0)
    fixed = MaskedImageModeling(pred_ratio_mean=[0.0, 0.5], pred_ratio_var=[0.0, 0.0])
    ratios = {fixed.draw_ratio() for _ in range(100)}
    assert ratios == {0.0, 0.5}
    spread = MaskedImageModeling(pred_ratio_mean=[0.3], pred_ratio_var=[0.2])
    draws = [spread.draw_ratio() for _ in range(1000)]
    assert 0.1 <= min(draws) < 0.12 and 0.48 < max(draws) <= 0.5
    assert abs(sum(draws) / len(draws) - 0.3) < 0.01


def test_transforms_return_the_image_and_a_mask() -> None:
    image = torch.randn(3, 32, 48)
    out = RandomPatchMasking(mask_ratio=0.75, patch_size=8)(image)
    assert out["data"] is image
    assert out["mask"].shape == (4, 6) and int((~out["mask"]).sum()) == 6
    out = MaskedImageModeling(pred_ratio_mean=[0.4], patch_size=8)(image)
    assert out["data"] is image and out["mask"].shape == (4, 6)
    assert 0 < int(out["mask"].sum()) <= int(24 * 0.4)


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"name": "RandomPatchMasking", "mask_ratio": 1.0}, "mask_ratio"),
        ({"name": "RandomPatchMasking", "patch_size": 0}, "patch_size"),
        ({"name": "RandomPatchMasking", "ratio": 0.5}, "ratio"),
        ({"name": "MaskedImageModeling", "pred_ratio_var": [0.1, 0.1]}, "pred_ratio_var"),
        ({"name": "MaskedImageModeling", "pred_ratio_mean": [0.9], "pred_ratio_var": [0.2]}, "+"),
        ({"name": "MaskedImageModeling", "log_aspect_ratio": [3.0, 0.3]}, "log_aspect_ratio"),
    ],
)
def test_bad_arguments_name_the_key(entry: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"TRANSFORMS\[0\].*{key}"):
        build_transforms([entry])


def test_an_image_that_is_not_whole_patches_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="multiple of patch_size"):
        RandomPatchMasking(patch_size=16)(torch.zeros(3, 40, 48))


def test_the_wrapper_appends_the_masks_and_the_collator_stacks_them() -> None:
    chain = build_transforms(
        [{"name": "RandomPatchMasking", "mask_ratio": 0.5, "patch_size": 4, "indices": [1]}]
    )
    samples = []
    for i in range(3):
        sample = {
            "data": [torch.zeros(3, 8, 8), torch.ones(3, 16, 16)],
            "label": [i, i],
            "data_valid": [1, 1],
            "data_idx": [i, i],
        }
        samples.append(chain(sample))
    assert [len(s["mask"]) for s in samples] == [1, 1, 1]  # one per transformed entry
    assert samples[0]["mask"][0].shape == (4, 4)
    batch = default_collate(samples)
    assert batch["mask"][0].shape == (3, 4, 4) and batch["mask"][0].dtype == torch.bool
    assert batch["data"][1].shape == (3, 3, 16, 16)


def _quick_mae_dataset() -> Any:
    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_mae"])
    return build_dataset(cfg, "TRAIN")


def test_masks_are_a_function_of_seed_epoch_and_index() -> None:
    """What exact resume relies on: the same (epoch, index) draws the same crop and mask
    in any order, another epoch or index another mask; the caller's RNG is untouched."""
    dataset = _quick_mae_dataset()
    state = torch.random.get_rng_state()
    first = [dataset[(i, 3)]["mask"][0] for i in range(8)]
    again = [dataset[(i, 3)]["mask"][0] for i in reversed(range(8))][::-1]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert torch.equal(torch.random.get_rng_state(), state)
    other_epoch = [dataset[(i, 4)]["mask"][0] for i in range(8)]
    assert any(not torch.equal(a, b) for a, b in zip(first, other_epoch, strict=True))
    assert len({tuple(m.flatten().tolist()) for m in first}) > 1  # indices differ
    assert all(int((~m).sum()) == 4 for m in first)  # 16 patches, ratio 0.75
    with seeded_rng(sample_seed(dataset.seed, 3, 5)):  # the transforms' own stream
        expected = dataset.transform(dataset._get_sample(5))["mask"][0]
    assert torch.equal(first[5], expected)


def test_block_mask_of_one_patch_grid_edge_cases() -> None:
    # a block must be strictly smaller than the grid (iBOT's w < W and h < H): a grid of
    # one patch is never masked, one of 2 x 2 only by 1 x 1 blocks
    assert int(block_mask((1, 1), 1).sum()) == 0
    torch.manual_seed(0)
    assert int(block_mask((2, 2), 3).sum()) == 3
    assert int(block_mask((4, 4), 0).sum()) == 0
    assert int(block_mask((2, 2), 10).sum()) <= 4
    assert math.isclose(num_kept(196, 0.75), 49)

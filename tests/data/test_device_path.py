"""DATA.TRAIN.TRANSFORMS_ON_DEVICE: the colour transforms batched on the device.

- each batched operation equals the tensor path's per-image operation (Pillow's formulas,
  ``tensor_ops``) with the same parameter, row by row;
- a whole tail (colour distortion, blur, solarize, per-view restrictions) equals a per-row
  reference built from the same random numbers and the per-image operations;
- the random numbers are uniform, and a function of (seed, epoch, index, view) only;
- the tail's outputs follow the same distributions as the worker-side chain;
- the chain is split where it should be, with clear errors where it cannot be;
- a training run with it works, gives uint8 crops from the loader, and repeats itself.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from tests.data.test_transform_distributions import (
    N,
    binomial_ok,
    colour_image,
    colour_stats,
    same_distribution,
    sharpness,
)
from vissl.data import build_transforms
from vissl.data.ssl_transforms import device_path as dp
from vissl.data.ssl_transforms import tensor_ops
from vissl.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def images(n: int = 6, c: int = 3, h: int = 13, w: int = 11, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, c, h, w, generator=g)


# ------------------------------------------------------------------ one op, row by row
@pytest.mark.parametrize(
    ("batched", "single", "factors"),
    [
        (dp.adjust_brightness, tensor_ops.adjust_brightness_, [0.3, 0.9, 1.0, 1.4, 1.8, 0.0]),
        (dp.adjust_contrast, tensor_ops.adjust_contrast_, [0.2, 0.6, 1.0, 1.3, 1.9, 0.0]),
        (dp.adjust_saturation, tensor_ops.adjust_saturation_, [0.0, 0.5, 1.0, 1.4, 2.0, 0.7]),
        (dp.adjust_hue, tensor_ops.adjust_hue_, [-0.5, -0.2, -0.003, 0.0, 0.11, 0.45]),
    ],
    ids=["brightness", "contrast", "saturation", "hue"],
)
def test_each_adjustment_equals_the_per_image_operation(batched, single, factors):
    for channels in (3, 1):
        x = images(c=channels)
        out = batched(x.clone(), torch.tensor(factors))
        for i, f in enumerate(factors):
            expected = single(x[i].clone(), f)
            torch.testing.assert_close(out[i], expected, atol=2e-6, rtol=0)


def test_grayscale_solarize_and_blur_equal_the_per_image_operations():
    x = images(n=5)
    mask = torch.tensor([True, False, True, True, False])
    out = dp.grayscale(x, mask)
    for i in range(5):
        expected = tensor_ops.to_grayscale(x[i], 3) if mask[i] else x[i]
        torch.testing.assert_close(out[i], expected, atol=1e-6, rtol=0)
    thresholds = torch.tensor([0.0, 100.0, 128.0, 255.0, 256.0])
    out = dp.solarize(x, thresholds, torch.ones(5, dtype=torch.bool))
    for i in range(5):
        torch.testing.assert_close(out[i], tensor_ops.solarize(x[i], float(thresholds[i])))
    radii = torch.tensor([0.0, 0.1, 0.7, 1.33, 2.0])
    out = dp.gaussian_blur(x, radii, radius_max=2.0)
    for i in range(5):
        expected = tensor_ops.gaussian_blur(x[i], float(radii[i])) if radii[i] > 0 else x[i]
        torch.testing.assert_close(out[i], expected, atol=2e-6, rtol=0)


# ------------------------------------------------------------- whole tails, row by row
def reference_jitter(img: torch.Tensor, u: torch.Tensor, ranges: list[Any]) -> torch.Tensor:
    """ColorJitter on one image from its 8 numbers, with the per-image operations."""
    order = torch.argsort(u[:4]).tolist()
    single = (
        tensor_ops.adjust_brightness_,
        tensor_ops.adjust_contrast_,
        tensor_ops.adjust_saturation_,
        tensor_ops.adjust_hue_,
    )
    for j in order:
        if ranges[j] is not None:
            lo, hi = ranges[j]
            img = single[j](img, float(lo + (hi - lo) * u[4 + j]))
    return img


def reference_tail(x: torch.Tensor, u: torch.Tensor, views: torch.Tensor) -> torch.Tensor:
    """SimCLR's colour distortion (jitter p 0.8, grey p 0.2), then blur (p 0.5, radius
    0.1-2) and solarize (p 0.2) of view 1 only, row by row, from the rows' numbers."""
    ranges = [(0.2, 1.8), (0.2, 1.8), (0.2, 1.8), (-0.2, 0.2)]
    out = []
    for i in range(x.shape[0]):
        img, r = x[i].clone(), u[i]
        if r[0] <= 0.8:
            img = reference_jitter(img, r[1:9], ranges)
        if r[9] < 0.2:
            img = tensor_ops.to_grayscale(img, 3)
        if r[10] <= 0.5:
            img = tensor_ops.gaussian_blur(img, 0.1 + 1.9 * float(r[11]))
        if views[i] == 1 and r[12] < 0.2:
            img = tensor_ops.solarize(img, math.floor(float(r[13]) * 257.0))
        out.append(img)
    return torch.stack(out)


def simclr_like_tail(seed: int = 3) -> dp.DeviceTail:
    ops: list[dp.DeviceOp] = [
        dp.ComposeOp(
            [
                dp.RandomApplyOp(
                    [dp.ColorJitterOp((0.2, 1.8), (0.2, 1.8), (0.2, 1.8), (-0.2, 0.2))], 0.8
                ),
                dp.GrayscaleOp(0.2),
            ]
        ),
        dp.GaussianBlurOp(0.5, 0.1, 2.0),
        dp.ViewsOp(dp.SolarizeOp(0.2), [1]),
    ]
    return dp.DeviceTail(ops, [0.5, 0.4, 0.3], [0.2, 0.25, 0.3], num_views=2, seed=seed)


def test_a_whole_tail_equals_the_per_row_reference():
    tail = simclr_like_tail()
    assert tail.op.slots == 14
    b = 40
    crops = (torch.rand(2 * b, 3, 9, 10, generator=torch.Generator().manual_seed(1)) * 255).to(
        torch.uint8
    )
    data_idx = torch.arange(100, 100 + b).repeat(2)  # view-major: both views of 100..139
    out = tail(crops, [data_idx], epoch=4)
    views = torch.arange(2 * b) // b
    u = dp.hash_uniforms(3, 4, data_idx, views, 14)
    expected = reference_tail(crops.float() / 255.0, u, views)
    mean = torch.tensor([0.5, 0.4, 0.3]).view(1, 3, 1, 1)
    std = torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1)
    torch.testing.assert_close(out, (expected - mean) / std, atol=2e-5, rtol=0)
    # the multicrop layout (a list of per-view tensors) gives the same rows
    listed = tail([crops[:b], crops[b:]], data_idx, epoch=4)
    torch.testing.assert_close(torch.cat(listed), out)
    # every branch was taken by some row: jitter, grey, blur, solarize (view 1 only)
    assert (u[:, 0] <= 0.8).any() and (u[:, 9] < 0.2).any() and (u[:, 10] <= 0.5).any()
    assert ((views == 1) & (u[:, 12] < 0.2)).any() and ((views == 0) & (u[:, 12] < 0.2)).any()


# --------------------------------------------------------------------- random numbers
def test_the_numbers_are_uniform_and_depend_on_every_coordinate():
    index = torch.arange(20_000)
    u = dp.hash_uniforms(0, 0, index, torch.zeros_like(index), 4)
    assert u.dtype == torch.float32 and u.min() >= 0.0 and u.max() < 1.0
    for column in range(4):
        assert stats.kstest(u[:, column].numpy(), "uniform").pvalue > 1e-3
    corr = np.corrcoef(u.numpy().T)
    assert np.abs(corr - np.eye(4)).max() < 0.03  # the draws of a row are independent
    assert torch.equal(u, dp.hash_uniforms(0, 0, index, torch.zeros_like(index), 4))
    base = u[:100]
    small = index[:100]
    for other in (
        dp.hash_uniforms(1, 0, small, torch.zeros_like(small), 4),  # seed
        dp.hash_uniforms(0, 1, small, torch.zeros_like(small), 4),  # epoch
        dp.hash_uniforms(0, 0, small, torch.ones_like(small), 4),  # view
        dp.hash_uniforms(0, 0, small + 1, torch.zeros_like(small), 4),  # index
    ):
        assert (other != base).float().mean() > 0.99


# ------------------------------------------------------------------- distributions
def tail_outputs(entries: list[dict[str, Any]], image: Any, n: int = N) -> list[torch.Tensor]:
    """``n`` outputs of the device tail of ``entries`` (one view) on the image's crop."""
    chain = build_transforms([dict(e) for e in entries])
    head, tail = dp.plan_device_path(chain, seed=7, key_path="config.DATA.TRAIN.X")
    sample = {"data": [image], "label": [0], "data_valid": [1], "data_idx": [0]}
    crop = head(sample)["data"][0]
    assert crop.dtype == torch.uint8
    batch = crop.unsqueeze(0).expand(n, -1, -1, -1).contiguous()
    return list(tail(batch, torch.arange(n), epoch=0))


def worker_outputs(entries: list[dict[str, Any]], image: Any, n: int = N) -> list[torch.Tensor]:
    chain = build_transforms([dict(e) for e in entries])
    outs = []
    for seed in range(50_000, 50_000 + n):
        torch.default_generator.manual_seed(seed)
        sample = {"data": [image], "label": [0], "data_valid": [1], "data_idx": [0]}
        outs.append(chain(sample)["data"][0])
    return outs


def test_colour_distortion_has_the_worker_chains_distribution():
    image = colour_image()
    entries = [{"name": "ImgPilColorDistortion", "strength": 1.0}, {"name": "ToTensor"}]
    ours = [colour_stats(o) for o in tail_outputs(entries, image)]
    theirs = [colour_stats(o) for o in worker_outputs(entries, image)]
    for column in range(3):  # brightness, saturation, hue (as red - green)
        assert same_distribution([s[column] for s in ours], [s[column] for s in theirs])
    assert binomial_ok(sum(s[3] for s in ours), N, 0.2)


def test_blur_and_solarize_have_the_worker_chains_distribution():
    rng = np.random.default_rng(1)
    from PIL import Image

    image = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    entries = [
        {"name": "ImgPilGaussianBlur", "p": 0.5, "radius_min": 0.1, "radius_max": 2.0},
        {"name": "ImgPilRandomSolarize", "p": 0.3},
        {"name": "ToTensor"},
    ]
    ours = [sharpness(o) for o in tail_outputs(entries, image)]
    theirs = [sharpness(o) for o in worker_outputs(entries, image)]
    assert same_distribution(ours, theirs)


# ------------------------------------------------------------------------- the plan
def test_the_chain_is_split_after_the_last_crop():
    entries = [
        {"name": "ImgReplicatePil", "num_times": 2},
        {"name": "RandomResizedCrop", "size": 16},
        {"name": "RandomHorizontalFlip"},
        {"name": "ImgPilColorDistortion", "strength": 0.5},
        {"name": "ImgPilGaussianBlur", "p": 0.5, "radius_min": 0.1, "radius_max": 2.0},
        {"name": "ImgPilRandomSolarize", "p": 0.2, "indices": [1]},
        {"name": "ToTensor"},
        {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]},
    ]
    head, tail = dp.plan_device_path(build_transforms(entries), seed=0, key_path="k")
    assert tail.names == [
        "ImgPilColorDistortion",
        "ImgPilGaussianBlur",
        "ImgPilRandomSolarize",
        "ToTensor",
    ]
    assert tail.num_views == 2 and tail.mean == [0.5, 0.5, 0.5]
    assert isinstance(tail.op.ops[2], dp.ViewsOp) and tail.op.ops[2].views == (1,)
    names = [w.name for w in head.transforms]
    assert names[-1] == "ToUint8Tensor" and "RandomHorizontalFlip" in names
    sample = {"data": [colour_image(40)], "label": [0], "data_valid": [1], "data_idx": [0]}
    crops = head(sample)["data"]
    assert len(crops) == 2 and all(c.dtype == torch.uint8 and c.shape == (3, 16, 16) for c in crops)


@pytest.mark.parametrize(
    ("entries", "fast"),
    [
        ([{"name": "RandomResizedCrop", "size": 8}], True),  # no ToTensor
        ([{"name": "RandomResizedCrop", "size": 8}, {"name": "ToTensor"}], False),  # PIL path
    ],
    ids=["no-ToTensor", "FAST_TRANSFORMS-off"],
)
def test_a_chain_that_cannot_be_split_is_a_config_error(entries, fast):
    chain = build_transforms(entries, tensor_path=fast)
    with pytest.raises(ConfigError, match="TRANSFORMS_ON_DEVICE=True moves the colour"):
        dp.plan_device_path(chain, seed=0, key_path="config.DATA.TRAIN.TRANSFORMS_ON_DEVICE")


# ---------------------------------------------------------------------- a real run
TINY = "test/cpu_test/tiny_simclr"


def run_losses(tmp_path: Any, name: str, *overrides: str) -> list[float]:
    from tests.integration._runs import read_jsonl, run_config

    folder = tmp_path / name
    run_config(
        TINY,
        "config.DATA.TRAIN.TRANSFORMS_ON_DEVICE=True",
        "config.LOG_FREQUENCY=1",
        f"config.CHECKPOINT.DIR={folder}",
        *overrides,
    )
    return [r["loss"] for r in read_jsonl(str(folder / "stdout.json"))]


def test_a_run_trains_on_uint8_crops_and_repeats_itself(tmp_path, monkeypatch):
    seen: list[tuple[torch.dtype, torch.dtype]] = []
    original = dp.DeviceTail.__call__

    def call(self, inputs, data_idx, epoch):
        out = original(self, inputs, data_idx, epoch)
        seen.append((inputs.dtype, out.dtype))
        return out

    monkeypatch.setattr(dp.DeviceTail, "__call__", call)
    first = run_losses(tmp_path, "a", "config.DATA.NUM_DATALOADER_WORKERS=1")
    second = run_losses(tmp_path, "b")  # no workers: the same augmentations
    assert len(first) == 8 and all(math.isfinite(v) for v in first)
    assert first == second
    # the loader gave uint8 crops, the model float ones: every step
    assert len(seen) == 16 and all(s == (torch.uint8, torch.float32) for s in seen)


def test_multicrop_random_apply_uses_each_crops_probability():
    op = dp.MultiCropRandomApplyOp([dp.GrayscaleOp(1.0)], view_probs=[1.0, 0.1, 0.5, 0.5])
    n = 4000
    view = torch.arange(n) % 4
    u = dp.hash_uniforms(0, 0, torch.arange(n), view, op.slots)
    x = images(n=n, h=2, w=2)
    out = op.apply(x, u, torch.ones(n, dtype=torch.bool), view)
    grey = (out.amax(1) - out.amin(1)).amax(dim=(1, 2)) < 1e-6
    for v, p in enumerate([1.0, 0.1, 0.5, 0.5]):
        hits = int(grey[view == v].sum())
        assert binomial_ok(hits, n // 4, p), (v, hits)
    assert torch.equal(grey, (u[:, 0] < torch.tensor([1.0, 0.1, 0.5, 0.5])[view]))


def test_dinos_chain_moves_jitter_blur_and_solarize_to_the_device():
    from vissl.utils.hydra_config import hydra_compose_and_validate

    _, cfg = hydra_compose_and_validate(["config=pretrain/dino/dino_8gpu_vits16"])
    chain = build_transforms([dict(e) for e in cfg.DATA.TRAIN.TRANSFORMS])
    head, tail = dp.plan_device_path(chain, seed=0, key_path="k")
    assert tail.names == [
        "ImgPilColorDistortion",
        "ImgPilMultiCropRandomApply",
        "ImgPilMultiCropRandomApply",
        "ToTensor",
    ]
    assert tail.num_views == 12
    blur, solarize = tail.op.ops[1], tail.op.ops[2]
    assert blur.view_probs == [1.0, 0.1] + [0.5] * 10
    assert solarize.view_probs == [0.0, 0.2] + [0.0] * 10
    sample = {"data": [colour_image(120)], "label": [0], "data_valid": [1], "data_idx": [0]}
    crops = head(sample)["data"]
    assert [c.shape[-1] for c in crops] == [224] * 2 + [96] * 10
    assert all(c.dtype == torch.uint8 for c in crops)
    views = [torch.stack([c]) for c in crops]  # a batch of one sample, multicrop layout
    out = tail(views, torch.zeros(12, dtype=torch.int64), epoch=0)
    assert [o.shape for o in out] == [(1, 3, 224, 224)] * 2 + [(1, 3, 96, 96)] * 10


def test_the_tail_reads_nothing_back_to_the_host(monkeypatch):
    tail = simclr_like_tail()
    crops = torch.zeros(8, 3, 6, 6, dtype=torch.uint8)
    tail(crops, torch.arange(4).repeat(2), epoch=0)  # the constants are copied once
    reads: list[str] = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, _o=original, _n=name, **k):
            reads.append(_n)
            return _o(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    tail(crops, torch.arange(4).repeat(2), epoch=1)
    tail([crops[:4], crops[4:]], torch.arange(4).repeat(2), epoch=1)
    assert reads == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_tail_on_cuda_gives_what_it_gives_on_the_cpu():
    tail = simclr_like_tail()
    crops = (torch.rand(16, 3, 20, 20, generator=torch.Generator().manual_seed(2)) * 255).to(
        torch.uint8
    )
    index = torch.arange(8).repeat(2)
    on_cpu = tail(crops, index, epoch=3)
    on_gpu = tail(crops.cuda(), index.cuda(), epoch=3)
    assert on_gpu.device.type == "cuda"
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_crash_and_resume_with_the_tail_on_the_device_is_bitwise_exact(tmp_path):
    from tests.integration._runs import run_config
    from tests.integration.test_exact_resume import assert_same, crash_generator, final_weights

    common = [
        "config.DATA.TRAIN.TRANSFORMS_ON_DEVICE=True",
        "config.DATA.TRAIN.DATA_LIMIT=32",
        "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
        "config.CHECKPOINT.AUTO_RESUME=True",
        "config.DATA.NUM_DATALOADER_WORKERS=1",
        "config.MULTI_PROCESSING_METHOD=fork",
    ]
    run_config(TINY, *common, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            TINY, *common, f"config.CHECKPOINT.DIR={crashed}", hook_generator=crash_generator(10)
        )
    run_config(TINY, *common, f"config.CHECKPOINT.DIR={crashed}")
    assert "resumed inside phase" in (crashed / "log.txt").read_text()
    assert_same(final_weights(tmp_path / "full"), final_weights(crashed))


# ------------------------------------------- real data sets and collators feed the tail
def tiny_dataset(transforms: list[dict[str, Any]], **split: Any) -> Any:
    from vissl.data import build_dataset
    from vissl.utils.hydra_config import hydra_compose_and_validate

    _, cfg = hydra_compose_and_validate([f"config={TINY}"])
    cfg.DATA.TRAIN.TRANSFORMS = transforms
    for key, value in split.items():
        cfg.DATA.TRAIN[key] = value
    return build_dataset(cfg, "TRAIN")


def is_grey(rows: torch.Tensor) -> torch.Tensor:
    return (rows.amax(1) - rows.amin(1)).flatten(1).amax(1) < 1e-6


def test_crops_restricted_by_indices_are_the_same_rows_as_in_the_workers():
    from vissl.data.collators.simclr_collator import simclr_collator
    from vissl.data.samplers import SampleKey

    entries = [
        {"name": "ImgReplicatePil", "num_times": 2},
        {"name": "RandomResizedCrop", "size": 16},
        {"name": "RandomGrayscale", "p": 1.0, "indices": [1]},
        {"name": "ToTensor"},
    ]
    dataset = tiny_dataset(entries)
    workers = [dataset[SampleKey(i, 0)] for i in range(3)]
    grey_in_workers = [bool(is_grey(s["data"][v][None])[0]) for s in workers for v in (0, 1)]
    assert grey_in_workers == [False, True] * 3
    tail = dataset.move_transforms_to_device()
    assert tail.num_views == 2
    batch = simclr_collator([dataset[SampleKey(i, 0)] for i in range(3)])
    out = tail(batch["data"][0], batch["data_idx"], epoch=0)
    assert is_grey(out).tolist() == [False] * 3 + [True] * 3  # view-major: view 1 grey


def test_multicrop_layout_maps_each_tensor_to_its_crop():
    from vissl.data.collators.multicrop_collator import multicrop_collator
    from vissl.data.samplers import SampleKey

    entries = [
        {
            "name": "ImgPilToMultiCrop",
            "total_num_crops": 3,
            "size_crops": [16, 8],
            "num_crops": [2, 1],
            "crop_scales": [[0.5, 1.0], [0.2, 0.5]],
        },
        {"name": "RandomGrayscale", "p": 1.0, "indices": [0, 2]},
        {"name": "ToTensor"},
    ]
    dataset = tiny_dataset(entries, COLLATE_FUNCTION="multicrop_collator")
    tail = dataset.move_transforms_to_device()
    assert tail.num_views == 3
    batch = multicrop_collator([dataset[SampleKey(i, 0)] for i in range(4)])
    out = tail(batch["data"][0], batch["data_idx"], epoch=0)
    assert [tuple(o.shape[-2:]) for o in out] == [(16, 16), (16, 16), (8, 8)]
    assert [bool(is_grey(o).all()) for o in out] == [True, False, True]
    assert not is_grey(out[1]).any()


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ({"COLLATE_FUNCTION": "moco_collator"}, "COLLATE_FUNCTION 'moco_collator'"),
        ({"INPUT_KEY_NAMES": ["data", "extra"]}, "INPUT_KEY_NAMES"),
    ],
    ids=["moco", "two-input-keys"],
)
def test_layouts_the_tail_does_not_know_are_config_errors(split, message):
    entries = [{"name": "RandomResizedCrop", "size": 8}, {"name": "ToTensor"}]
    dataset = tiny_dataset(entries, **split)
    with pytest.raises(ConfigError, match=message):
        dataset.move_transforms_to_device()


def test_a_restriction_to_crops_the_chain_does_not_make_is_a_config_error():
    entries = [
        {"name": "ImgReplicatePil", "num_times": 2},
        {"name": "RandomResizedCrop", "size": 8},
        {"name": "ImgPilColorDistortion", "strength": 0.5},
        {"name": "RandomGrayscale", "p": 0.5, "indices": [3]},
        {"name": "ToTensor"},
    ]
    with pytest.raises(ConfigError, match=r"restricted to crops \[3\] but the chain makes 2"):
        dp.plan_device_path(build_transforms(entries), seed=0, key_path="k")


def test_several_data_sources_are_a_config_error():
    dataset = tiny_dataset([{"name": "RandomResizedCrop", "size": 8}, {"name": "ToTensor"}])
    dataset.data_objs = dataset.data_objs * 2  # as with DATA_SOURCES of two entries
    with pytest.raises(ConfigError, match="supports one data source"):
        dataset.move_transforms_to_device()

"""DATA.TRAIN.DECODE_ON_DEVICE: the workers plan, the device decodes, crops and flips.

- the device's decode (``decode_jpeg`` on the CPU here) gives the workers' pixels, grey
  JPEGs as three channels;
- the planned crops and flips are the worker path's draws (same boxes, same RNG use), for
  the same seed, epoch and index;
- the crops made from the packed rows equal the worker path's crops bit for bit on the CPU
  (Pillow's uint8 kernel), within one grey level with the float kernel a GPU runs; in the
  simclr and multicrop layouts, with flips before and after the crop;
- CMYK JPEGs, files that are no JPEG under a JPEG name and unreadable files are decoded in
  the workers as before; a JPEG that fails on the device becomes a gray image;
- packing: any row order, the batch's bytes plus a row's padding, clear errors otherwise;
- config errors: the key without TRANSFORMS_ON_DEVICE, a source without files, PNG files,
  a workers' chain that needs pixels;
- a training run with the key on gives the losses of the worker decode;
- on CUDA (skipped without one): nvJPEG's pixels and crops near the CPU's.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

from vissl.data import build_dataset
from vissl.data import device_decode as dd
from vissl.data.collators.multicrop_collator import multicrop_collator
from vissl.data.collators.simclr_collator import simclr_collator
from vissl.data.data_sources.disk import EncodedImage
from vissl.data.samplers import SampleKey
from vissl.data.ssl_transforms.seeding import seeded_rng
from vissl.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = "test/cpu_test/tiny_simclr"
CPU = torch.device("cpu")
KEY = "config.DATA.TRAIN.DECODE_ON_DEVICE"

SIMCLR = [
    {"name": "ImgReplicatePil", "num_times": 2},
    {"name": "RandomResizedCrop", "size": 24},
    {"name": "RandomHorizontalFlip"},
    {"name": "ImgPilColorDistortion", "strength": 0.5},
    {"name": "ImgPilGaussianBlur", "p": 0.5, "radius_min": 0.1, "radius_max": 2.0},
    {"name": "ToTensor"},
    {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]},
]


def textured(h: int, w: int, seed: int) -> np.ndarray:
    """Gradients, a product pattern and noise: every crop box gives different pixels."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    image = np.stack([xx * 255 // w, yy * 255 // h, (xx * yy) % 256], -1).astype(np.int64)
    return np.clip(image + rng.integers(-40, 40, image.shape), 0, 255).astype(np.uint8)


def write_jpeg(path: Path, array: np.ndarray, mode: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(array)
    if mode is not None:
        image = image.convert(mode)
    image.save(path, format="JPEG", quality=90)
    return path


@pytest.fixture
def jpeg_folder(tmp_path: Path) -> Path:
    """``root/{a,b}/*.jpg``: 12 textured JPEGs of 40-90 px, two of them grey."""
    root = tmp_path / "jpegs"
    rng = np.random.default_rng(0)
    for i in range(12):
        h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
        mode = "L" if i in (3, 8) else None
        write_jpeg(root / "ab"[i % 2] / f"{i:02d}.jpg", textured(h, w, i), mode)
    return root


@pytest.fixture
def smooth_folder(tmp_path: Path) -> Path:
    """Colour gradients with grey (luminance-only) noise: chroma varies slowly, so decoders
    that upsample chroma differently (nvJPEG, libjpeg-turbo's "fancy" upsampling) agree."""
    root = tmp_path / "smooth"
    rng = np.random.default_rng(1)
    for i in range(12):
        h, w = int(rng.integers(60, 120)), int(rng.integers(60, 120))
        yy, xx = np.mgrid[0:h, 0:w]
        colour = np.stack(
            [xx * 200 // w + 20, yy * 200 // h + 20, (xx + yy) * 100 // (h + w) + 60], -1
        )
        grey = rng.integers(-30, 30, (h, w, 1))
        image = np.clip(colour + grey, 0, 255).astype(np.uint8)
        write_jpeg(root / "ab"[i % 2] / f"{i:02d}.jpg", image, "L" if i == 5 else None)
    return root


def dataset(root: Path, transforms: list[dict[str, Any]], decode: bool = True, **split: Any) -> Any:
    from vissl.utils.hydra_config import hydra_compose_and_validate

    _, cfg = hydra_compose_and_validate(
        [
            f"config={TINY}",
            "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
            f"config.DATA.TRAIN.DATA_PATHS=[{root}]",
            "config.DATA.TRAIN.DATA_LIMIT=-1",
            "config.DATA.TRAIN.TRANSFORMS_ON_DEVICE=True",
            f"config.DATA.TRAIN.DECODE_ON_DEVICE={decode}",
        ]
    )
    cfg.DATA.TRAIN.TRANSFORMS = [dict(t) for t in transforms]
    for key, value in split.items():
        cfg.DATA.TRAIN[key] = value
    return build_dataset(cfg, "TRAIN")


def both_paths(root: Path, transforms: list[dict[str, Any]], **split: Any) -> tuple[Any, ...]:
    """(worker-decode dataset, its tail, device-decode dataset, its DecodeTail)."""
    workers = dataset(root, transforms, decode=False, **split)
    worker_tail = workers.move_transforms_to_device()
    device = dataset(root, transforms, decode=True, **split)
    decode_tail = device.move_transforms_to_device()
    assert isinstance(decode_tail, dd.DecodeTail)
    return workers, worker_tail, device, decode_tail


# ------------------------------------------------------------------------ the decode
def test_the_device_decode_gives_the_workers_pixels(jpeg_folder):
    ds = dataset(jpeg_folder, SIMCLR)
    source = ds.data_objs[0]
    encoded = [source.get_encoded_image(i)[0] for i in range(len(source))]
    assert all(e.is_jpeg for e in encoded)
    decoded = dd.decode_jpegs([torch.from_numpy(e.data.copy()) for e in encoded], CPU)
    for i, (e, image) in enumerate(zip(encoded, decoded)):
        expected, valid = source.get_image_tensor(i)  # the workers' libjpeg-turbo decode
        assert valid and image is not None
        assert image.shape == (3, e.height, e.width)  # grey JPEGs too: three channels
        assert torch.equal(image, expected)
    paths = source.get_image_paths()
    greys = [image for path, image in zip(paths, decoded) if path.endswith(("03.jpg", "08.jpg"))]
    assert len(greys) == 2
    for grey in greys:
        assert torch.equal(grey[0], grey[1]) and torch.equal(grey[1], grey[2])


# -------------------------------------------------------------------- the random draws
def test_the_plans_draw_what_the_worker_path_draws(jpeg_folder, monkeypatch):
    workers, _, device, _ = both_paths(jpeg_folder, SIMCLR)
    original = T.RandomResizedCrop.get_params
    boxes: list[tuple[tuple[int, ...], tuple[int, int, int, int]]] = []

    def spy(img, scale, ratio):
        box = original(img, scale, ratio)
        boxes.append((tuple(img.shape[-2:]), box))
        return box

    monkeypatch.setattr(T.RandomResizedCrop, "get_params", staticmethod(spy))

    def run(ds: Any, idx: int, seed: int) -> tuple[Any, list[Any], torch.Tensor]:
        boxes.clear()
        with seeded_rng(seed):
            sample = ds._get_sample(idx)
            after = torch.rand(4)  # the generator's state after the chain
        return sample, list(boxes), after

    flips = 0
    for epoch in range(3):
        for idx in range(len(device)):
            seed = 1000 * epoch + idx
            theirs, their_boxes, their_rng = run(workers, idx, seed)
            ours, our_boxes, our_rng = run(device, idx, seed)
            assert our_boxes == their_boxes  # the same boxes, from the same image size
            assert torch.equal(our_rng, their_rng)  # and the same amount of randomness
            plans = ours["data"]
            assert [(p.top, p.left, p.height, p.width) for p in plans] == [b for _, b in our_boxes]
            for plan, crop in zip(plans, theirs["data"]):
                # the worker's crop is the plan's box, resized, flipped as planned
                image = workers.data_objs[0].get_image_tensor(idx)[0]
                made = dd.tensor_ops.resized_crop(
                    image, plan.top, plan.left, plan.height, plan.width, (24, 24)
                )
                assert torch.equal(made.flip(-1) if plan.hflip else made, crop)
                flips += plan.hflip
    assert 0 < flips < 3 * 2 * len(device)  # both outcomes of the flip were drawn


# ---------------------------------------------------------------------------- the crops
#: The float kernel (a GPU's) against Pillow's uint8 kernel (the workers'): both sum the
#: same antialiased bilinear weights, but Pillow rounds the image to 8 bits between its
#: horizontal and vertical passes. That rounding moves an intermediate value by at most 0.5
#: and the vertical weights are non-negative and sum to 1, so a final value moves by at
#: most 0.5 before its own rounding: at most one grey level; about one pixel in seven is
#: one level off on these images (mean 0.15), hence the bound 0.25 on the mean.
FLOAT_KERNEL_MAX, FLOAT_KERNEL_MEAN = 1, 0.25


def test_simclr_crops_equal_the_worker_paths(jpeg_folder):
    transforms = [
        {"name": "ImgReplicatePil", "num_times": 2},
        {"name": "RandomHorizontalFlip"},  # flips before the crop: the box is mirrored
        {"name": "RandomVerticalFlip"},
        *SIMCLR[1:],
    ]
    workers, worker_tail, device, tail = both_paths(jpeg_folder, transforms)
    for epoch in range(3):
        keys = [SampleKey(i, epoch) for i in range(len(device))]
        theirs = simclr_collator(workers.__getitems__(keys))
        ours = simclr_collator(device.__getitems__(keys))
        rows = ours["data"][0]
        assert rows.dtype == torch.uint8 and rows.dim() == 2
        assert torch.equal(ours["data_idx"][0], theirs["data_idx"][0])
        crops = tail.decode(rows, CPU)
        assert torch.equal(crops, theirs["data"][0])  # bit for bit on the CPU
        out = tail(rows, ours["data_idx"], epoch)
        assert torch.equal(out, worker_tail(theirs["data"][0], theirs["data_idx"], epoch))
        tail.float_resize = True
        diff = (tail.decode(rows, CPU).int() - theirs["data"][0].int()).abs()
        tail.float_resize = None
        assert diff.max() <= FLOAT_KERNEL_MAX and diff.float().mean() <= FLOAT_KERNEL_MEAN


def test_multicrop_crops_equal_the_worker_paths(jpeg_folder):
    transforms = [
        {
            "name": "ImgPilToMultiCrop",
            "total_num_crops": 5,
            "size_crops": [24, 12],
            "num_crops": [2, 3],
            "crop_scales": [[0.3, 1.0], [0.05, 0.3]],
        },
        {"name": "RandomHorizontalFlip"},
        {"name": "ImgPilColorDistortion", "strength": 1.0},
        {"name": "ImgPilMultiCropRandomApply", "transforms": [{"name": "ImgPilGaussianBlur",
            "p": 1.0, "radius_min": 0.1, "radius_max": 2.0}], "prob": [1.0, 0.1, 0.5],
            "nmb_crops": [1, 1, 3]},
        {"name": "ToTensor"},
    ]  # fmt: skip
    workers, worker_tail, device, tail = both_paths(
        jpeg_folder, transforms, COLLATE_FUNCTION="multicrop_collator"
    )
    assert tail.num_views == 5
    keys = [SampleKey(i, 2) for i in range(7)]
    theirs = multicrop_collator(workers.__getitems__(keys))
    ours = multicrop_collator(device.__getitems__(keys))
    crops = tail.decode(ours["data"][0], CPU)
    assert [tuple(c.shape) for c in crops] == [(7, 3, 24, 24)] * 2 + [(7, 3, 12, 12)] * 3
    for mine, expected in zip(crops, theirs["data"][0]):
        assert torch.equal(mine, expected)
    out = tail(ours["data"][0], ours["data_idx"], 2)
    expected_out = worker_tail(theirs["data"][0], theirs["data_idx"], 2)
    for mine, expected in zip(out, expected_out):
        assert torch.equal(mine, expected)


def test_odd_files_are_decoded_in_the_workers_as_before(tmp_path, caplog):
    root = tmp_path / "odd"
    write_jpeg(root / "a" / "0_rgb.jpg", textured(50, 60, 0))
    write_jpeg(root / "a" / "1_cmyk.jpg", textured(40, 70, 1), mode="CMYK")
    write_jpeg(root / "a" / "2_grey.jpg", textured(60, 45, 2), mode="L")
    Image.fromarray(textured(44, 52, 3)).save(root / "a" / "3_png.jpg", format="PNG")
    (root / "a" / "4_broken.jpg").write_bytes(b"not an image at all")
    workers, _, device, tail = both_paths(root, SIMCLR)
    encoded = [device.data_objs[0].get_encoded_image(i) for i in range(5)]
    assert [e.is_jpeg for e, _ in encoded] == [True, False, True, False, False]
    assert [valid for _, valid in encoded] == [True, True, True, True, False]
    assert "is not a JPEG file" in caplog.text
    keys = [SampleKey(i, 0) for i in range(5)]
    theirs = simclr_collator(workers.__getitems__(keys))
    ours = simclr_collator(device.__getitems__(keys))
    assert torch.equal(ours["data_valid"][0], theirs["data_valid"][0])  # 1, 1, 1, 1, -1
    assert torch.equal(tail.decode(ours["data"][0], CPU), theirs["data"][0])


def test_a_jpeg_that_fails_on_the_device_becomes_a_gray_image(tmp_path, caplog):
    good = write_jpeg(tmp_path / "good.jpg", textured(30, 40, 0)).read_bytes()
    broken = good[: len(good) // 2]  # a sound header, half the data
    tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in (good, broken)]
    decoded = dd.decode_jpegs(tensors, CPU)
    assert decoded[0] is not None and decoded[0].shape == (3, 30, 40) and decoded[1] is None
    assert "one by one" in caplog.text
    plans = [
        dd.ViewPlan.full(EncodedImage(np.frombuffer(b, dtype=np.uint8), 30, 40, True))
        for b in (good, broken)
    ]
    samples = [
        {"data": [p], "label": [0], "data_valid": [1], "data_idx": [i]} for i, p in enumerate(plans)
    ]
    rows = simclr_collator(dd.pack_views(samples))["data"][0]
    crops = dd.DecodeTail(colour=None).decode(rows, CPU)  # type: ignore[arg-type]
    assert torch.equal(crops[0], decoded[0]) and bool((crops[1] == 128).all())


# ------------------------------------------------------------------------------ packing
def raw_plans(sizes: list[int], views: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    samples = []
    for i, n in enumerate(sizes):
        image = EncodedImage(rng.integers(0, 256, 3 * n * n, dtype=np.uint8), n, n, False)
        plan = dd.ViewPlan.full(image)
        samples.append(
            {
                "data": [plan] * views,
                "label": [i] * views,
                "data_valid": [1] * views,
                "data_idx": [i] * views,
            }
        )
    return samples


def test_packing_spreads_the_batchs_bytes_over_its_rows():
    sizes = [40, 3, 17, 90, 5]  # very unequal files: no padding to the largest
    samples = raw_plans(sizes, views=3)
    originals = [s["data"][0].image.data.copy() for s in samples]
    rows = simclr_collator(dd.pack_views(samples))["data"][0]
    total = sum(3 * n * n for n in sizes)
    assert rows.shape[0] == 15 and rows.numel() <= total + 15 * (dd.HEADER_BYTES + 1)
    for order in (torch.arange(15), torch.randperm(15, generator=torch.Generator().manual_seed(0))):
        header, buffer = dd.unpack_rows(rows[order])
        for r in range(15):
            offset, length = int(header[r, dd.F_OFFSET]), int(header[r, dd.F_LENGTH])
            sample = int(order[r]) % 5
            assert torch.equal(
                buffer[offset : offset + length], torch.from_numpy(originals[sample])
            )
    # rows packed apart (dataset[i] one by one) are not one packing
    apart = [dd.pack_views([s])[0] for s in raw_plans([4, 4], views=1)]  # equal widths
    with pytest.raises(ValueError, match="several packings"):
        dd.unpack_rows(simclr_collator(apart)["data"][0])
    with pytest.raises(ValueError, match="not packed"):
        dd.unpack_rows(torch.zeros(4, 100, dtype=torch.uint8))
    with pytest.raises(ValueError, match="packed uint8 rows"):
        dd.unpack_rows(torch.zeros(4, 3, 8, 8))


# -------------------------------------------------------------------------- config errors
def write_pngs(root: Path) -> Path:
    for i in range(2):
        (root / "a").mkdir(parents=True, exist_ok=True)
        Image.fromarray(textured(20, 20, i)).save(root / "a" / f"{i}.png")
    return root


@pytest.mark.parametrize(
    "case", ["no-transforms-on-device", "synthetic", "png", "pixels-needed", "two-crops"]
)
def test_config_errors_name_the_key_and_the_fix(case, jpeg_folder, tmp_path):
    from vissl.utils.hydra_config import hydra_compose_and_validate

    if case in ("no-transforms-on-device", "synthetic"):
        on_device = case == "synthetic"
        _, cfg = hydra_compose_and_validate(
            [
                f"config={TINY}",
                f"config.DATA.TRAIN.TRANSFORMS_ON_DEVICE={on_device}",
                "config.DATA.TRAIN.DECODE_ON_DEVICE=True",
            ]
        )
        with pytest.raises(ConfigError) as err:
            build_dataset(cfg, "TRAIN").move_transforms_to_device()
        expected = "TRANSFORMS_ON_DEVICE=True" if not on_device else "'synthetic' does not read"
    else:
        root = write_pngs(tmp_path / "pngs") if case == "png" else jpeg_folder
        transforms = list(SIMCLR)
        if case == "pixels-needed":
            transforms.insert(2, {"name": "CenterCrop", "size": 20})
        if case == "two-crops":
            transforms.insert(2, {"name": "RandomResizedCrop", "size": 20})
        with pytest.raises(ConfigError) as err:
            dataset(root, transforms).move_transforms_to_device()
        expected = {
            "png": "are not JPEG files",
            "pixels-needed": r"TRANSFORMS[2] (CenterCrop)",
            "two-crops": "crops a view twice",
        }[case]
    assert expected in str(err.value)
    assert err.value.key_path == KEY and KEY in str(err.value)
    assert f"{KEY}=False" in str(err.value) or "TRANSFORMS_ON_DEVICE=True: set" in str(err.value)


# --------------------------------------------------------------------------- a real run
def test_a_run_with_the_key_on_gives_the_losses_of_the_worker_decode(
    jpeg_folder, tmp_path, monkeypatch
):
    from tests.integration._runs import read_jsonl, run_config

    seen: list[torch.dtype] = []
    original = dd.DecodeTail.decode

    def decode(self, inputs, device):
        seen.append(inputs.dtype)
        return original(self, inputs, device)

    monkeypatch.setattr(dd.DecodeTail, "decode", decode)
    # the packed bytes are decoded from the host: read_sample moves the decoded views,
    # never the packed rows, to the device (a round trip costs a copy and a host sync)
    from vissl.trainer.train_steps import standard_train_step as sts

    moved: list[int] = []
    real_move = sts.move_to_device

    def move(sample, device):
        if isinstance(sample, dict) and isinstance(sample.get("input"), torch.Tensor):
            moved.append(sample["input"].dim())
        return real_move(sample, device)

    monkeypatch.setattr(sts, "move_to_device", move)
    transforms = "[{name: ImgReplicatePil, num_times: 2}, {name: RandomResizedCrop, size: 32}, {name: RandomHorizontalFlip}, {name: ImgPilColorDistortion, strength: 0.5}, {name: ToTensor}]"

    def losses(name: str, *overrides: str) -> list[float]:
        folder = tmp_path / name
        run_config(
            TINY,
            "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
            f"config.DATA.TRAIN.DATA_PATHS=[{jpeg_folder}]",
            "config.DATA.TRAIN.DATA_LIMIT=-1",
            f"config.DATA.TRAIN.TRANSFORMS={transforms}",
            "config.DATA.TRAIN.TRANSFORMS_ON_DEVICE=True",
            "config.LOG_FREQUENCY=1",
            f"config.CHECKPOINT.DIR={folder}",
            *overrides,
        )
        return [r["loss"] for r in read_jsonl(str(folder / "stdout.json"))]

    workers = losses("workers")
    assert not seen
    decoded = losses("device", f"{KEY}=True", "config.DATA.NUM_DATALOADER_WORKERS=1")
    assert len(decoded) == 6 and all(math.isfinite(v) for v in decoded)
    assert decoded == workers  # the same crops, so the very same training
    assert seen == [torch.uint8] * 6  # every step decoded its packed rows
    assert moved and set(moved) == {4}, moved  # decoded (N, 3, h, w) views only


# ---------------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nvjpeg_gives_the_cpus_pixels_and_crops_within_tolerance(smooth_folder):
    """nvJPEG and libjpeg-turbo differ in their IDCT and chroma upsampling: below 2 grey
    levels on average (torchvision's own bound for its CUDA decoder against its CPU one;
    these images keep chroma smooth so that the upsampling matters little; a wrong channel
    order, a shift or a misread box would give tens); the crops add the float kernel's
    rounding (FLOAT_KERNEL_MEAN)."""
    cuda = torch.device("cuda")
    _, _, device, tail = both_paths(smooth_folder, SIMCLR)
    source = device.data_objs[0]
    encoded = [torch.from_numpy(source.get_encoded_image(i)[0].data.copy()) for i in range(12)]
    on_gpu = dd.decode_jpegs(encoded, cuda)
    on_cpu = dd.decode_jpegs(encoded, CPU)
    for gpu, cpu in zip(on_gpu, on_cpu):
        assert gpu is not None and cpu is not None
        assert gpu.device.type == "cuda" and gpu.shape == cpu.shape  # grey ones: 3 channels
        assert (gpu.cpu().float() - cpu.float()).abs().mean() < 2.0
    keys = [SampleKey(i, 1) for i in range(12)]
    rows = simclr_collator(device.__getitems__(keys))["data"][0]
    crops_cpu = tail.decode(rows, CPU)
    crops_gpu = tail.decode(rows.to(cuda), cuda)  # as read_sample gives them
    assert crops_gpu.device.type == "cuda" and crops_gpu.dtype == torch.uint8
    assert (crops_gpu.cpu().float() - crops_cpu.float()).abs().mean() < 2.0 + FLOAT_KERNEL_MEAN
    index = torch.arange(12).repeat(2)
    out = tail(rows.to(cuda), index.to(cuda), 1)
    assert out.device.type == "cuda" and out.shape == (24, 3, 24, 24) and out.isfinite().all()


def test_jpeg_bytes_stay_undecoded_in_the_workers(jpeg_folder, monkeypatch):
    ds = dataset(jpeg_folder, SIMCLR)
    ds.move_transforms_to_device()
    import vissl.data.data_sources.disk as disk

    def no_decode(*args, **kwargs):
        raise AssertionError("decoded in the worker")

    monkeypatch.setattr(disk, "_decode_jpeg", no_decode)
    monkeypatch.setattr(disk.DiskImageDataset, "_decode_bytes", no_decode)
    sample = ds[SampleKey(0, 0)]
    assert [tuple(row.shape) for row in sample["data"]] == [tuple(sample["data"][0].shape)] * 2
    plans = ds._get_sample(0)["data"]
    with io.BytesIO(bytes(plans[0].image.data)) as f:
        assert Image.open(f).format == "JPEG"

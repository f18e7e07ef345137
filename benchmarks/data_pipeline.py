"""How fast does vissl turn a JPEG into training crops? (the ``data_pipeline`` benchmark)

Samples per second of one data loader worker, for the augmentation chains of SimCLR
(2 x 224), SwAV (2 x 224 + 6 x 96) and DINO (2 x 224 + 10 x 96), three ways:

- **baseline**: the plain torchvision + PIL chain the config describes, written as one
  would by hand: ``Image.open(path).convert("RGB")``, then for every view a
  ``torchvision.transforms.Compose`` of ``RandomResizedCrop``, ``RandomHorizontalFlip``,
  ``RandomApply([ColorJitter])``, ``RandomGrayscale``, a PIL Gaussian blur (and
  solarization) with the config's probabilities, ``ToTensor`` and ``Normalize``;
- **vissl, PIL path**: vissl's dataset (``disk_folder`` source, per-sample seeding, the
  config's ``TRANSFORMS`` built by vissl's builder) with the tensor path turned off, i.e.
  what VISSL ran;
- **default**: the same dataset as users get it: the transforms before ``ToTensor`` run
  on tensors (:mod:`vissl.data.ssl_transforms.tensor_path`).

The transform lists come from the real configs (``pretrain/simclr/simclr_8gpu_resnet``,
``pretrain/swav/swav_8gpu_resnet``, ``pretrain/dino/dino_8gpu_vits16``) composed by
vissl; the baseline is translated from the same list. The JPEGs are made here, in a
temporary folder: ImageNet-like sizes (most about 400-500 x 300-375, some portrait, one
in ten about 1000 x 750), smooth gradients with shapes and mild noise, quality 90.

Everything runs in this one process with one torch thread (the throughput of one
worker); the variants run interleaved, the order rotating every round, each over all the
images. The table gives the median samples/s and the median over rounds of the per-round
ratio to the baseline. With ``--workers N`` the chains also run through real data
loaders with N worker processes (vissl's ``get_loader``; a plain ``DataLoader`` for the
baseline), reported as samples/s per worker. The last line is
``data_pipeline: default/baseline <ratio>x`` for the SimCLR chain (or the one chain run).

Usage::

    python benchmarks/data_pipeline.py                      # all chains, 64 images, 5 rounds
    python benchmarks/data_pipeline.py --chain simclr --num-images 16 --rounds 3 --quiet
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torchvision.transforms as T
from PIL import Image, ImageDraw, ImageFilter, ImageOps

CONFIGS = {
    "simclr": "pretrain/simclr/simclr_8gpu_resnet",
    "swav": "pretrain/swav/swav_8gpu_resnet",
    "dino": "pretrain/dino/dino_8gpu_vits16",
}
VARIANTS = ("baseline", "vissl_pil", "default", "device")
LABELS = {
    "baseline": "torchvision + PIL (baseline)",
    "vissl_pil": "vissl, PIL path",
    "default": "vissl default (tensor path)",
    "device": "vissl, colour on device: the worker's part",
}


# ----------------------------------------------------------------------------- images
def make_jpeg(path: str, width: int, height: int, seed: int, quality: int = 90) -> None:
    """A photo-like JPEG: smooth colour gradients, large and many small shapes (edges),
    luminance texture at several scales and mild noise; about 0.45 bytes per pixel at
    quality 90 (ImageNet's JPEGs average 0.5-0.8; pure noise would be several)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b, phase = rng.uniform(-1.0, 1.0, 3)
        base[..., c] = 128 + 50 * np.sin(a * xx / width * 6 + b * yy / height * 6 + phase * 3)
    image = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    num_small = int(800 * width * height / (500 * 375))
    for i in range(16 + num_small):
        reach = (width // 2, height // 2) if i < 16 else (16, 16)
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1 = x0 + int(rng.integers(2, max(3, reach[0])))
        y1 = y0 + int(rng.integers(2, max(3, reach[1])))
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape([x0, y0, x1, y1], fill=colour)
    pixels = np.asarray(image.filter(ImageFilter.GaussianBlur(0.7))).astype(np.float32)
    for cell, amplitude in ((24, 12.0), (6, 9.0), (2, 6.0)):
        coarse = rng.normal(0.0, amplitude, (height // cell + 2, width // cell + 2))
        size = ((width // cell + 2) * cell, (height // cell + 2) * cell)
        texture = Image.fromarray(coarse.astype(np.float32), mode="F").resize(size, Image.BILINEAR)
        pixels += np.asarray(texture)[:height, :width, None]
    pixels += rng.normal(0.0, 5.0, (height, width, 3))
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(path, quality=quality)


def image_size(rng: np.random.Generator) -> tuple[int, int]:
    """An ImageNet-like (width, height): mostly ~500 x 375, some portrait, some large."""
    kind = rng.random()
    width, height = int(rng.integers(400, 501)), int(rng.integers(300, 376))
    if kind < 0.1:
        width = int(rng.integers(900, 1201))
        height = int(width * rng.uniform(0.66, 0.8))
    elif kind < 0.25:
        width, height = height, width
    return width, height


def make_image_folder(root: str, num_images: int, seed: int = 0) -> list[str]:
    """``num_images`` JPEGs in ``root/images/`` (a one-class ``disk_folder``)."""
    folder = os.path.join(root, "images")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(num_images):
        path = os.path.join(folder, f"{i:05d}.jpg")
        width, height = image_size(rng)
        make_jpeg(path, width, height, seed=seed * 100003 + i)
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------- baseline
class PilRandomBlur:
    """The usual hand-written SimCLR/DINO blur: PIL ``GaussianBlur`` of a random radius."""

    def __init__(self, p: float = 0.5, radius_min: float = 0.1, radius_max: float = 2.0):
        self.p, self.radius_min, self.radius_max = p, radius_min, radius_max

    def __call__(self, image: Image.Image) -> Image.Image:
        if random.random() >= self.p:
            return image
        radius = random.uniform(self.radius_min, self.radius_max)
        return image.filter(ImageFilter.GaussianBlur(radius=radius))


class PilRandomSolarize:
    """Solarize with a threshold drawn from 0..256, with probability ``p``."""

    def __init__(self, p: float = 0.66):
        self.p = p

    def __call__(self, image: Image.Image) -> Image.Image:
        if random.random() >= self.p:
            return image
        return ImageOps.solarize(image, random.randint(0, 256))


class PlainRandomApply:
    """Apply ``transforms`` with probability ``p`` (one draw per image)."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]], p: float):
        self.transforms, self.p = list(transforms), p

    def __call__(self, image: Any) -> Any:
        if random.random() >= self.p:
            return image
        for transform in self.transforms:
            image = transform(image)
        return image


def _plain_op(entry: dict[str, Any]) -> Callable[[Any], Any]:
    name = entry["name"]
    kwargs = {k: v for k, v in entry.items() if k not in ("name", "indices")}
    if name == "ImgPilColorDistortion":
        s = float(kwargs.get("strength", 1.0))
        jitter = T.ColorJitter(
            float(kwargs.get("brightness", 0.8)) * s,
            float(kwargs.get("contrast", 0.8)) * s,
            float(kwargs.get("saturation", 0.8)) * s,
            float(kwargs.get("hue", 0.2)) * s,
        )
        return T.Compose(
            [
                T.RandomApply([jitter], p=float(kwargs.get("color_jitter_probability", 0.8))),
                T.RandomGrayscale(p=float(kwargs.get("grayscale_probability", 0.2))),
            ]
        )
    if name == "ImgPilGaussianBlur":
        return PilRandomBlur(**kwargs)
    if name == "ImgPilRandomSolarize":
        return PilRandomSolarize(**kwargs)
    if name in ("RandomResizedCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"):
        return getattr(T, name)(**kwargs)  # type: ignore[no-any-return]
    raise SystemExit(f"data_pipeline: no plain torchvision form of transform {name!r}")


def plain_views(entries: Sequence[dict[str, Any]]) -> list[T.Compose]:
    """The config's transform list as one torchvision ``Compose`` per view."""
    views: list[list[Callable[[Any], Any]]] = [[]]
    for entry in entries:
        entry = dict(entry)
        name = entry["name"]
        if name == "ImgReplicatePil":
            views = [list(v) for v in views for _ in range(int(entry.get("num_times", 2)))]
        elif name == "ImgPilToMultiCrop":
            base = views[0]
            views = []
            specs = zip(entry["size_crops"], entry["num_crops"], entry["crop_scales"])
            for size, num, scale in specs:
                views += [
                    [*base, T.RandomResizedCrop(size, scale=tuple(scale))] for _ in range(num)
                ]
        elif name == "ImgPilMultiCropRandomApply":
            inner = [_plain_op(dict(e)) for e in entry["transforms"]]
            probs = entry["prob"]  # one per crop type of its own nmb_crops
            types = [t for t, n in enumerate(entry["nmb_crops"]) for _ in range(n)]
            if len(types) != len(views):
                raise SystemExit(f"data_pipeline: {name} expects {len(types)} crops")
            for view, crop_type in zip(views, types):
                view.append(PlainRandomApply(inner, probs[crop_type]))
        else:
            op = _plain_op(entry)
            for view in views:
                view.append(op)
    return [T.Compose(v) for v in views]


class PlainDataset(torch.utils.data.Dataset[list[torch.Tensor]]):
    """The baseline as a dataset: open, convert to RGB, one ``Compose`` per view."""

    def __init__(self, paths: Sequence[str], views: Sequence[T.Compose]):
        self.paths, self.views = list(paths), list(views)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, idx: int) -> list[torch.Tensor]:
        image = Image.open(self.paths[idx]).convert("RGB")
        return [view(image) for view in self.views]


# ----------------------------------------------------------------------------- vissl side
def compose_config(chain: str, folder: str) -> Any:
    from vissl.utils.hydra_config import hydra_compose_and_validate

    overrides = [
        f"config={CONFIGS[chain]}",
        f"config.DATA.TRAIN.DATA_PATHS=[{folder}]",
        "config.DISTRIBUTED.NUM_NODES=1",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
    ]
    _, cfg = hydra_compose_and_validate(overrides)
    return cfg


def vissl_datasets(cfg: Any) -> dict[str, Any]:
    """vissl's dataset of the config: as built (default) and with the PIL path."""
    from vissl.data import build_dataset, build_transforms

    default = build_dataset(cfg, "TRAIN")
    pil = build_dataset(cfg, "TRAIN")
    pil.transform = build_transforms(cfg.DATA.TRAIN.TRANSFORMS, "TRAIN", tensor_path=False)
    device = build_dataset(cfg, "TRAIN")  # TRANSFORMS_ON_DEVICE: the workers' part
    tail = device.move_transforms_to_device()
    return {"default": default, "vissl_pil": pil, "device": device, "tail": tail}


# ----------------------------------------------------------------------------- timing
@dataclass
class ChainResult:
    chain: str
    num_views: int
    view_sizes: list[int]
    seconds: dict[str, list[float]] = field(default_factory=dict)
    loader: dict[str, float] = field(default_factory=dict)
    tail_ms: float = float("nan")  # the device tail, ms per sample (on --tail-device)


def _run_pass(get: Callable[[int], Any], n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        get(i)
    return time.perf_counter() - start


def _view_sizes(views: Sequence[torch.Tensor]) -> list[int]:
    return [int(v.shape[-1]) for v in views]


def bench_chain(
    chain: str,
    folder: str,
    paths: Sequence[str],
    rounds: int,
    seed: int = 0,
    tail_device: str = "cpu",
) -> ChainResult:
    from vissl.data.samplers import SampleKey

    cfg = compose_config(chain, folder)
    views = plain_views([dict(e) for e in cfg.DATA.TRAIN.TRANSFORMS])
    baseline = PlainDataset(paths, views)
    datasets = vissl_datasets(cfg)
    n = len(paths)
    if len(datasets["default"]) != n:
        raise SystemExit(f"data_pipeline: the dataset has {len(datasets['default'])} images")
    epoch = [0]  # a new epoch every round: new random crops, as the baseline draws
    getters: dict[str, Callable[[int], Any]] = {
        "baseline": baseline.__getitem__,
        "vissl_pil": lambda i: datasets["vissl_pil"][SampleKey(i, epoch[0])],
        "default": lambda i: datasets["default"][SampleKey(i, epoch[0])],
        "device": lambda i: datasets["device"][SampleKey(i, epoch[0])],
    }
    random.seed(seed)
    torch.manual_seed(seed)
    # warm-up (page cache, lazy imports) and a check that all sides make the same crops
    shapes = {}
    for variant, get in getters.items():
        sample = get(0)
        data = sample if isinstance(sample, list) else sample["data"]
        shapes[variant] = [tuple(v.shape) for v in data]
        _run_pass(get, min(n, 4))
    if len(set(map(tuple, shapes.values()))) != 1:
        raise SystemExit(f"data_pipeline: the variants make different crops: {shapes}")
    result = ChainResult(chain, len(views), [s[-1] for s in shapes["default"]])
    result.seconds = {v: [] for v in VARIANTS}
    for r in range(rounds):
        epoch[0] = r + 1
        k = r % len(VARIANTS)
        order = VARIANTS[k:] + VARIANTS[:k]
        for variant in order:
            result.seconds[variant].append(_run_pass(getters[variant], n))
    result.tail_ms = time_tail(datasets["device"], datasets["tail"], n, tail_device)
    return result


def time_tail(dataset: Any, tail: Any, n: int, device: str, reps: int = 3) -> float:
    """ms per sample of the device tail on a batch of ``n`` samples' uint8 crops."""
    from vissl.data.samplers import SampleKey

    crops = [dataset[SampleKey(i, 0)]["data"] for i in range(n)]
    views = [torch.stack([c[v] for c in crops]).to(device) for v in range(len(crops[0]))]
    data_idx = torch.arange(n).repeat(len(views)).to(device)
    times = []
    for _ in range(reps + 1):  # the first is a warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        tail(views, data_idx, epoch=1)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times[1:]) / n


def bench_loaders(
    chain: str, folder: str, paths: Sequence[str], workers: int, batch_size: int, rounds: int
) -> dict[str, float]:
    """Samples/s per worker through real data loaders with ``workers`` processes."""
    from vissl.data import get_loader

    cfg = compose_config(chain, folder)
    cfg.DATA.NUM_DATALOADER_WORKERS = workers
    cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA = batch_size
    cfg.DATA.TRAIN.DROP_LAST = False
    datasets = vissl_datasets(cfg)
    views = plain_views([dict(e) for e in cfg.DATA.TRAIN.TRANSFORMS])
    loaders: dict[str, Any] = {
        "baseline": torch.utils.data.DataLoader(
            PlainDataset(paths, views),
            batch_size=batch_size,
            num_workers=workers,
            persistent_workers=True,
            multiprocessing_context=cfg.MULTI_PROCESSING_METHOD,
        )
    }
    for variant in ("vissl_pil", "default", "device"):
        loaders[variant] = get_loader(
            datasets[variant],
            cfg,
            "TRAIN",
            num_replicas=1,
            rank=0,
            seed=0,
            device_is_cuda=False,
        )
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for loader in loaders.values():
        for _ in loader:  # start the workers
            pass
    for r in range(rounds):
        k = r % len(VARIANTS)
        for variant in VARIANTS[k:] + VARIANTS[:k]:
            start = time.perf_counter()
            for _ in loaders[variant]:
                pass
            times[variant].append(time.perf_counter() - start)
    return {v: len(paths) / statistics.median(t) / workers for v, t in times.items()}


# ----------------------------------------------------------------------------- report
def ratio_to_baseline(result: ChainResult, variant: str) -> float:
    """Median over rounds of baseline time / variant time (same round, same images)."""
    pairs = zip(result.seconds["baseline"], result.seconds[variant])
    return statistics.median(b / v for b, v in pairs)


def describe(result: ChainResult) -> str:
    sizes: dict[int, int] = {}
    for s in result.view_sizes:
        sizes[s] = sizes.get(s, 0) + 1
    return f"{result.chain} ({' + '.join(f'{n}x{s}' for s, n in sizes.items())})"


def print_table(results: Sequence[ChainResult], num_images: int, workers: int) -> None:
    head = "| chain | variant | samples/s | ms/sample | crops/s | vs baseline |"
    if workers:
        head += f" samples/s per worker ({workers} workers) |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for result in results:
        for variant in VARIANTS:
            seconds = statistics.median(result.seconds[variant])
            rate = num_images / seconds
            ratio = 1.0 if variant == "baseline" else ratio_to_baseline(result, variant)
            row = (
                f"| {describe(result)} | {LABELS[variant]} | {rate:.1f} | "
                f"{1000 / rate:.2f} | {rate * result.num_views:.0f} | {ratio:.2f}x |"
            )
            if workers:
                row += f" {result.loader.get(variant, float('nan')):.1f} |"
            print(row)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-images", type=int, default=64, help="JPEGs to make (default 64)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--chain", choices=(*CONFIGS, "all"), default="all")
    p.add_argument(
        "--workers", type=int, default=0, help="also through data loaders with N workers"
    )
    p.add_argument("--batch-size", type=int, default=16, help="loader batch size (--workers)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tail-device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where to time the colour tail of TRANSFORMS_ON_DEVICE (default cpu)",
    )
    p.add_argument("--quiet", action="store_true", help="hide vissl's log lines")
    args = p.parse_args(argv)
    if args.num_images < 1 or args.rounds < 1 or args.workers < 0:
        p.error("--num-images and --rounds must be >= 1, --workers >= 0")
    return args


def _image_sizes(paths: Sequence[str]) -> list[tuple[int, int]]:
    sizes = []
    for path in paths:
        with Image.open(path) as image:
            sizes.append(image.size)
    return sizes


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    threads, vissl_logger = torch.get_num_threads(), logging.getLogger("vissl")
    level = vissl_logger.level
    torch.set_num_threads(1)  # one data loader worker's setting
    if args.quiet:
        vissl_logger.setLevel(logging.WARNING)
    chains = list(CONFIGS) if args.chain == "all" else [args.chain]
    root = tempfile.mkdtemp(prefix="vissl_data_pipeline_")
    try:
        paths = make_image_folder(root, args.num_images, seed=args.seed)
        sizes = _image_sizes(paths)
        kbytes = statistics.median(os.path.getsize(p) for p in paths) / 1024
        print(
            f"data_pipeline: {len(paths)} JPEGs (median "
            f"{statistics.median(w for w, _ in sizes):.0f}x"
            f"{statistics.median(h for _, h in sizes):.0f}, {kbytes:.0f} KB, largest "
            f"{max(w * h for w, h in sizes) / 1e6:.2f} MP), {args.rounds} rounds, one "
            f"process, torch threads {torch.get_num_threads()}"
        )
        results = []
        for chain in chains:
            result = bench_chain(
                chain, root, paths, args.rounds, seed=args.seed, tail_device=args.tail_device
            )
            if args.workers:
                result.loader = bench_loaders(
                    chain, root, paths, args.workers, args.batch_size, max(1, args.rounds // 2)
                )
            results.append(result)
        print_table(results, len(paths), args.workers)
        for result in results:
            print(
                f"{describe(result)}: the colour tail of TRANSFORMS_ON_DEVICE on "
                f"{args.tail_device}, batched: {result.tail_ms:.2f} ms/sample"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
        torch.set_num_threads(threads)
        vissl_logger.setLevel(level)
    final = next((r for r in results if r.chain == "simclr"), results[0])
    ratio = ratio_to_baseline(final, "default")
    print(f"data_pipeline: default/baseline {ratio:.2f}x")
    return {"results": results, "ratio": ratio}


if __name__ == "__main__":
    main()

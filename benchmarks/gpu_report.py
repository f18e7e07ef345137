"""vissl's trainer against a hand-written PyTorch loop on three GPU workloads (``gpu_report``).

One command, one markdown table: images/s per GPU, peak memory and host syncs per step of
three self-supervised workloads, each run through vissl's real trainer
(``launch_distributed`` -> ``train`` engine -> ``standard_train_step`` with the config's
default hooks and the hooks its loss declares) and through a hand-written plain-PyTorch
loop over the same model, loss, optimizer, batch and precision, in the same process:

1. ``simclr``: SimCLR, ResNet-50, bf16 autocast, ``MODEL.CHANNELS_LAST``, 2 views of
   224 px, batch 128; the ``pretrain/simclr/simclr_8gpu_resnet`` recipe (LARC SGD).
   Batches are random tensors made once on the device (model and step throughput).
2. ``dino``: DINO, ViT-S/16, multi-crop 2x224 + 10x96 px, bf16, batch 64; the
   ``pretrain/dino/dino_8gpu_vits16`` recipe (AdamW, gradient clipping, frozen last layer).
   The teacher's forward and its EMA update are in both loops. Random crops on the device.
3. ``barlow``: Barlow Twins, ViT-S/16, 2 views of 224 px, bf16, batch 256, through the
   real data loader (``synthetic`` images of 256 px, loader workers) with
   ``DATA.TRAIN.TRANSFORMS_ON_DEVICE``: the workers crop and flip ``uint8`` images, the
   colour transforms run batched on the GPU (``task.device_transforms["TRAIN"]`` in the
   trainer; the same object, built the same way, in the hand loop). The recipe is
   ``pretrain/barlow_twins/barlow_twins_8gpu_resnet`` (its BYOL-style asymmetric chain and
   loss) with the trunk swapped for ViT-S/16 and, like the published anchor printed next
   to it, a 3-layer projector 2048 wide and AdamW (lr 5e-4, weight decay 0.05).
   ``--cpu-augmentation``: the colour transforms in the workers instead.

Each workload runs ``--rounds`` interleaved rounds (the order of the two variants alternates);
each run times ``--steps`` steps after ``--warmup`` untimed ones (from the end of the last
warm-up step to the end of the last step, the device synchronized at both edges). The table
gives medians, and the median of the per-round ratios vissl/hand loop. Peak memory is
``torch.cuda.max_memory_allocated`` over a run (the statistics are reset before it starts).
Host syncs per step are counted in a separate pass of each variant, over the same window,
with ``torch.cuda.set_sync_debug_mode("warn")`` and ``warnings.catch_warnings``;
``LOG_FREQUENCY`` is larger than the run, so no log step is counted. On a CPU they are n/a.

The vissl side runs with the config's default hooks, with perf stats, TensorBoard and the
progress bar off (``--override`` turns them on); its final checkpoint is written after the
window, outside the timing.

With the defaults (warm-up 5, 20 timed steps, 3 rounds, and the counting pass) the whole
report takes a few minutes on one H100 (8 runs per workload); ``--rounds``/``--steps`` trade
time for spread. ``--tiny --device cpu`` runs it all in seconds (the CI smoke test).

Usage::

    python benchmarks/gpu_report.py --quiet                       # all three, defaults
    python benchmarks/gpu_report.py --workloads barlow --cpu-augmentation --quiet
    python benchmarks/gpu_report.py --tiny --device cpu --rounds 1 --steps 2   # smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from vissl.hooks.base import VisslHook  # noqa: E402


def _sibling(filename: str) -> ModuleType:
    """``benchmarks/<filename>`` as a module, under the name the tests' loader uses
    (``tests/benchmarks/_load.py``), so that both share one copy."""
    name = "vissl_benchmark_" + filename.removesuffix(".py")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


#: the trainer plumbing shared with ``train_step_overhead.py`` (in-memory batches, quiet runs)
tso = _sibling("train_step_overhead.py")

WORKLOADS = ("simclr", "dino", "barlow", "mae", "ibot")
#: ``hand_aa``: the hand loop again, the A/A control whose spread is the noise floor
VARIANTS = ("vissl", "hand", "hand_aa")
VARIANT_LABELS = {"vissl": "vissl", "hand": "hand loop", "hand_aa": "hand loop (A/A)"}
CONFIGS = {
    "simclr": "pretrain/simclr/simclr_8gpu_resnet",
    "dino": "pretrain/dino/dino_8gpu_vits16",
    "barlow": "pretrain/barlow_twins/barlow_twins_8gpu_resnet",
    "mae": "pretrain/mae/mae_8gpu_vitb16",
    "ibot": "pretrain/ibot/ibot_8gpu_vits16",
}
DEFAULT_BATCH = {"simclr": 128, "dino": 64, "barlow": 256, "mae": 256, "ibot": 64}
#: the workloads whose batches come from the real loader at every step (the others use
#: one batch made ahead and kept on the device)
LOADER_WORKLOADS = ("barlow",)
#: the workloads whose in-memory batch is one batch of the real loader (their collators
#: make masks), moved to the device once
COLLATED_WORKLOADS = ("mae", "ibot")
TINY_BATCH = 4
#: barlow: the synthetic images' side (RandomResizedCrop makes 224 px views of them)
BARLOW_IMAGE_SIZE = 256
#: barlow: the projector's width (the anchor's; the Barlow Twins paper uses 8192)
BARLOW_PROJECTOR_DIM = 2048
ANCHOR = (
    "stable-pretraining: 870.9 samples/s for Barlow Twins ViT-S/16, batch 256, bf16, GPU "
    "augmentation, on one H200 (341.6 with CPU augmentation)"
)
#: ``--tiny``: a 2-block ViT of width 32 (8 px patches) and a narrow ResNet-18
TINY_VIT = {
    "name": None,
    "IMAGE_SIZE": 32,
    "PATCH_SIZE": 8,
    "HIDDEN_DIM": 32,
    "NUM_LAYERS": 2,
    "NUM_HEADS": 2,
    "MLP_DIM": 64,
}
TINY_SIZES = {"global": 32, "local": 16, "image": 40}
#: the synthetic images' side for the in-memory MAE and iBOT batches (full size)
COLLATED_IMAGE_SIZE = 256
#: the stable-pretraining convention (its ``benchmark_gpu_vs_cpu.py`` ``_StepTimer``)
SPT_CONVENTION = (
    "stable-pretraining's convention: the device synchronized at the end of every step, "
    "samples/s = batch / mean step time (end of one step to the end of the next, after "
    "warm-up), a sample = one source image with both its views"
)


# ---------------------------------------------------------------------- flags
def _default_workers() -> int:
    return max(0, min((os.cpu_count() or 1) - 1, 12))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags (see the module docstring)."""
    p = argparse.ArgumentParser(
        description="vissl's trainer against a hand-written PyTorch loop: images/s, peak "
        "memory and host syncs per step on SimCLR, DINO and Barlow Twins."
    )
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--steps", type=int, default=50, help="timed steps per run (default 50)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    p.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="interleaved rounds, the order of the variants rotating (default 5)",
    )
    p.add_argument(
        "--batch-size",
        nargs="+",
        default=[],
        metavar="[WORKLOAD=]N",
        help="per-GPU batch: one number for every workload, or e.g. dino=32 barlow=128 "
        f"(defaults {', '.join(f'{k} {v}' for k, v in DEFAULT_BATCH.items())}; --tiny 4)",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda" if torch.cuda.is_available() else "cpu",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=_default_workers(),
        help="barlow's data loader workers (default min(cpu_count - 1, 12))",
    )
    p.add_argument(
        "--cpu-augmentation",
        action="store_true",
        help="barlow: the colour transforms in the loader workers (TRANSFORMS_ON_DEVICE False)",
    )
    p.add_argument(
        "--barlow-projector-dim",
        type=int,
        default=None,
        help=f"barlow: projector width (default {BARLOW_PROJECTOR_DIM}, the anchor's; the "
        "paper's is 8192)",
    )
    p.add_argument("--fp32", action="store_true", help="no autocast (default: bf16)")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="CPU smoke-test sizes: ResNet-18 x0.25 and a 2-block ViT of width 32, on 32/16 px, "
        "batch 4",
    )
    p.add_argument("--no-count", action="store_true", help="skip the host-sync counting pass")
    p.add_argument(
        "--no-spt",
        action="store_true",
        help="barlow: skip the pass counted as stable-pretraining counts samples/s",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        help="extra config override for every workload (both variants build from it), e.g. "
        "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=True",
    )
    p.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    p.add_argument("--quiet", action="store_true", help="hide the trainer's log lines")
    args = p.parse_args(argv)
    args.batch = _parse_batch_sizes(p, args.batch_size, TINY_BATCH if args.tiny else None)
    if args.barlow_projector_dim is None:
        args.barlow_projector_dim = 64 if args.tiny else BARLOW_PROJECTOR_DIM
    for name in ("steps", "rounds", "warmup", "barlow_projector_dim"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.workers < 0:
        p.error("--workers must be >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available on this machine (use --device cpu)")
    args.workloads = [w for w in WORKLOADS if w in args.workloads]
    return args


def _parse_batch_sizes(
    parser: argparse.ArgumentParser, values: Sequence[str], default: int | None
) -> dict[str, int]:
    batch = {w: default or DEFAULT_BATCH[w] for w in WORKLOADS}
    for value in values:
        name, _, number = value.rpartition("=")
        if name and name not in WORKLOADS:
            parser.error(f"--batch-size {value}: unknown workload {name!r} (one of {WORKLOADS})")
        try:
            size = int(number)
        except ValueError:
            parser.error(f"--batch-size {value}: not a number")
        if size < 1:
            parser.error(f"--batch-size {value}: must be >= 1")
        for w in [name] if name else WORKLOADS:
            batch[w] = size
    return batch


# ---------------------------------------------------------------------- configs
def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar (unquoted keys; strings quoted when needed)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return value if value.isidentifier() else "'" + value.replace("'", "\\'") + "'"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(hydra_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as a Hydra override")


def _set(key: str, value: Any) -> str:
    return f"config.{key}={hydra_value(value)}"


def _resized_transforms(
    transforms: Sequence[Any], global_size: int, local_size: int, patch_size: int
) -> list[Any]:
    """The chain with its crop sizes and mask patch sizes replaced (``--tiny``)."""
    out = []
    for t in transforms:
        t = dict(t.to_dict() if hasattr(t, "to_dict") else t)
        if t.get("name") == "RandomResizedCrop":
            t["size"] = global_size
        if t.get("name") == "ImgPilToMultiCrop":
            t["size_crops"] = [global_size, local_size][: len(t["size_crops"])]
        if t.get("name") in ("RandomPatchMasking", "MaskedImageModeling"):
            t["patch_size"] = patch_size
        out.append(t)
    return out


def _mlp(dims: list[int], bn_relu: bool) -> list[Any]:
    params: dict[str, Any] = {"dims": dims, "use_bias": False}
    if bn_relu:
        params.update(use_bn=True, use_relu=True, skip_last_layer_relu_bn=False)
    return ["mlp", params]


def workload_overrides(args: argparse.Namespace, name: str, folder: str) -> list[str]:
    """The Hydra overrides of one workload (both variants build from the same config)."""
    batch = args.batch[name]
    total = args.warmup + args.steps
    cuda = args.device == "cuda"
    in_memory = name not in LOADER_WORKLOADS
    overrides = [
        f"config={CONFIGS[name]}",
        "config.SEED_VALUE=0",
        "config.TEST_MODEL=False",
        "config.TEST_ONLY=False",
        # no log step inside the window (the first iteration, a warm-up step, logs)
        f"config.LOG_FREQUENCY={total + 1000}",
        "config.METERS.names=[]",
        "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=False",
        "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=False",
        "config.HOOKS.PROGRESS_BAR=False",
        "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
        "config.DATA.TRAIN.DATASET_NAMES=[]",
        "config.DATA.TRAIN.DATA_PATHS=[]",
        "config.DATA.TRAIN.LABEL_TYPE=sample_index",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={batch}",
        # len(loader) == warm-up + timed steps: the schedules and max_iteration match
        f"config.DATA.TRAIN.DATA_LIMIT={batch * total}",
        "config.DATA.TRAIN.DROP_LAST=True",
        f"config.DATA.NUM_DATALOADER_WORKERS={0 if in_memory else args.workers}",
        f"config.DATA.PIN_MEMORY={cuda and not in_memory}",
        # the loader's workers: fork, PyTorch's own default on Linux, on both sides
        "config.MULTI_PROCESSING_METHOD=fork",
        "config.OPTIMIZER.num_epochs=1",
        "config.DISTRIBUTED.NUM_NODES=1",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
        f"config.DISTRIBUTED.BACKEND={'nccl' if cuda else 'gloo'}",
        f"config.MACHINE.DEVICE={'gpu' if cuda else 'cpu'}",
        f"config.MODEL.AMP_PARAMS.USE_AMP={not args.fp32}",
        "config.MODEL.AMP_PARAMS.AMP_TYPE=pytorch",
        "config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16",
        f"config.CHECKPOINT.DIR={folder}",
        "config.CHECKPOINT.AUTO_RESUME=False",
        "config.CHECKPOINT.OVERWRITE_EXISTING=True",
    ]
    if name == "simclr":
        overrides.append("config.MODEL.CHANNELS_LAST=True")
        if args.tiny:
            overrides += [
                "config.MODEL.TRUNK.RESNETS.DEPTH=18",
                "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
                _set(
                    "MODEL.HEAD.PARAMS",
                    [
                        [
                            "mlp",
                            {
                                "dims": [128, 128],
                                "use_relu": True,
                                "skip_last_layer_relu_bn": False,
                            },
                        ],
                        ["mlp", {"dims": [128, 32]}],
                    ],
                ),
                "config.LOSS.simclr_info_nce_loss.buffer_params.embedding_dim=32",
            ]
    elif name == "dino":
        if args.tiny:
            overrides += [
                *(_set(f"MODEL.TRUNK.VISION_TRANSFORMERS.{k}", v) for k, v in TINY_VIT.items()),
                _set(
                    "MODEL.HEAD.PARAMS",
                    [
                        [
                            "dino_head",
                            {
                                "in_dim": 32,
                                "num_clusters": [64],
                                "hidden_dim": 64,
                                "bottleneck_dim": 16,
                                "num_layers": 3,
                                "use_bn": False,
                                "normalize_last_layer": True,
                            },
                        ]
                    ],
                ),
                "config.LOSS.dino_loss.output_dim=64",
            ]
    elif name == "mae":
        overrides += [
            # one optimizer step per batch (the recipe accumulates 2 batches per step)
            "config.OPTIMIZER.GRAD_ACCUMULATION_STEPS=1",
            f"config.DATA.TRAIN.DEFAULT_GRAY_IMG_SIZE="
            f"{TINY_SIZES['image'] if args.tiny else COLLATED_IMAGE_SIZE}",
        ]
        if args.tiny:
            overrides += [
                *(_set(f"MODEL.TRUNK.VISION_TRANSFORMERS.{k}", v) for k, v in TINY_VIT.items()),
                _set(
                    "MODEL.HEAD.PARAMS",
                    [
                        [
                            "mae_decoder",
                            {
                                "in_dim": 32,
                                "decoder_dim": 32,
                                "decoder_depth": 2,
                                "decoder_num_heads": 2,
                            },
                        ]
                    ],
                ),
            ]
    elif name == "ibot":
        overrides.append(
            f"config.DATA.TRAIN.DEFAULT_GRAY_IMG_SIZE="
            f"{TINY_SIZES['image'] if args.tiny else COLLATED_IMAGE_SIZE}"
        )
        if args.tiny:
            overrides += [
                *(_set(f"MODEL.TRUNK.VISION_TRANSFORMERS.{k}", v) for k, v in TINY_VIT.items()),
                _set(
                    "MODEL.HEAD.PARAMS",
                    [
                        [
                            "ibot_head",
                            {
                                "in_dim": 32,
                                "out_dim": 64,
                                "hidden_dim": 64,
                                "bottleneck_dim": 16,
                                "num_layers": 3,
                                "shared_head": True,
                                "normalize_last_layer": False,
                            },
                        ]
                    ],
                ),
            ]
    else:
        width = args.barlow_projector_dim
        trunk_dim = TINY_VIT["HIDDEN_DIM"] if args.tiny else 384
        vit: dict[str, Any] = (
            dict(TINY_VIT) if args.tiny else {"name": "small", "IMAGE_SIZE": 224, "PATCH_SIZE": 16}
        )
        vit.update(QKV_BIAS=True, CLASSIFIER="token")
        overrides += [
            "config.MODEL.TRUNK.NAME=vision_transformer",
            *(_set(f"MODEL.TRUNK.VISION_TRANSFORMERS.{k}", v) for k, v in vit.items()),
            _set(
                "MODEL.HEAD.PARAMS",
                [
                    _mlp([trunk_dim, width], True),
                    _mlp([width, width], True),
                    _mlp([width, width], False),
                ],
            ),
            f"config.LOSS.barlow_twins_loss.embedding_dim={width}",
            # AdamW, constant rate, as the anchor (LARS is the ResNet recipe)
            "config.OPTIMIZER.name=adamw",
            "config.OPTIMIZER.weight_decay=0.05",
            "config.OPTIMIZER.param_schedulers.lr={name: constant, value: 0.0005}",
            f"config.DATA.TRAIN.DEFAULT_GRAY_IMG_SIZE="
            f"{TINY_SIZES['image'] if args.tiny else BARLOW_IMAGE_SIZE}",
            f"config.DATA.TRAIN.TRANSFORMS_ON_DEVICE={not args.cpu_augmentation}",
        ]
    return overrides + list(args.override)


def compose(args: argparse.Namespace, name: str, folder: str) -> Any:
    """The validated ``config`` section of one workload."""
    from vissl.utils.hydra_config import hydra_compose_and_validate

    overrides = workload_overrides(args, name, folder)
    if args.tiny:
        # the recipe's own chain, with tiny crops
        _, base = hydra_compose_and_validate(overrides)
        chain = _resized_transforms(
            base.DATA.TRAIN.TRANSFORMS,
            TINY_SIZES["global"],
            TINY_SIZES["local"],
            int(TINY_VIT["PATCH_SIZE"]),
        )
        overrides.append(_set("DATA.TRAIN.TRANSFORMS", chain))
    _, cfg = hydra_compose_and_validate(overrides)
    return cfg


def view_sizes(cfg: Any) -> list[int]:
    """One side length per view of a sample, from the config's chain."""
    views, size = 1, None
    for t in cfg.DATA.TRAIN.TRANSFORMS:
        if t.get("name") == "ImgPilToMultiCrop":
            return [int(s) for s, n in zip(t["size_crops"], t["num_crops"]) for _ in range(n)]
        if t.get("name") == "ImgReplicatePil":
            views = int(t.get("num_times", 2))
        if t.get("name") == "RandomResizedCrop":
            size = int(t["size"])
    if size is None:
        raise SystemExit("the config's chain has no RandomResizedCrop or ImgPilToMultiCrop")
    return [size] * views


def make_batch(cfg: Any, device: torch.device) -> dict[str, Any]:
    """A collated batch of random views on ``device``, laid out as the config's collator
    lays it out (``simclr_collator``: one view-major tensor; ``multicrop_collator``: a
    tensor per crop)."""
    sizes = view_sizes(cfg)
    batch = int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
    rows = batch * len(sizes)
    torch.manual_seed(0)
    if cfg.DATA.TRAIN.COLLATE_FUNCTION == "multicrop_collator":
        data: Any = [torch.randn(batch, 3, s, s, device=device) for s in sizes]
    else:
        if len(set(sizes)) != 1:
            raise SystemExit(f"views of different sizes {sizes} need the multicrop_collator")
        data = torch.randn(rows, 3, sizes[0], sizes[0], device=device)
    index = torch.arange(batch, device=device).repeat(len(sizes))
    return {
        "data": [data],
        "label": [index.clone()],
        "data_valid": [torch.ones(rows, dtype=torch.int64, device=device)],
        "data_idx": [index],
    }


def make_collated_batch(cfg: Any, device: torch.device) -> dict[str, Any]:
    """The first batch of the config's own loader (its transforms, masks and collator:
    MAE's patch masks, iBOT's block masks), moved to ``device`` once."""
    from vissl.data.batch import move_to_device

    loader, tail = _host_loader(cfg, device)
    if tail is not None:
        raise SystemExit("an in-memory batch cannot take TRANSFORMS_ON_DEVICE")
    batch = next(iter(loader))
    return move_to_device(dict(batch), device)  # type: ignore[no-any-return]


def workload_title(args: argparse.Namespace, name: str, cfg: Any) -> str:
    sizes = Counter(view_sizes(cfg))
    views = " + ".join(f"{n}x{s}" for s, n in sizes.items())
    vit = cfg.MODEL.TRUNK.VISION_TRANSFORMERS
    named = {"small": "ViT-S", "base": "ViT-B", "large": "ViT-L"}
    vit_name = (
        f"{named[vit.name]}/{vit.PATCH_SIZE}"
        if vit.name in named
        else f"ViT of {vit.NUM_LAYERS} blocks x{vit.HIDDEN_DIM}/{vit.PATCH_SIZE}"
    )
    if name == "simclr":
        r = cfg.MODEL.TRUNK.RESNETS
        width = f" x{r.WIDTH_MULTIPLIER:g}" if r.WIDTH_MULTIPLIER != 1 else ""
        return f"SimCLR ResNet-{r.DEPTH}{width}, {views}, channels_last"
    if name == "dino":
        return f"DINO {vit_name}, {views}"
    if name == "mae":
        ratio = next(
            (t.get("mask_ratio") for t in cfg.DATA.TRAIN.TRANSFORMS if "mask_ratio" in t), None
        )
        return f"MAE {vit_name}, {views}, mask ratio {ratio}"
    if name == "ibot":
        return f"iBOT {vit_name}, {views}, block masks"
    where = "CPU" if args.cpu_augmentation else ("GPU" if args.device == "cuda" else "device")
    return f"Barlow Twins {vit_name}, {views}, {where} augmentation, {args.workers} loader workers"


# ---------------------------------------------------------------------- measuring
class SyncCounter:
    """Counts the synchronizing CUDA calls between :meth:`start` and :meth:`stop`
    (``torch.cuda.set_sync_debug_mode("warn")``), by the Python line that made them."""

    def __init__(self) -> None:
        self.count = 0
        self.sites: Counter[str] = Counter()
        self._catcher: Any = None
        self._log: list[warnings.WarningMessage] = []

    def start(self) -> None:
        self._catcher = warnings.catch_warnings(record=True)
        self._log = self._catcher.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> None:
        try:
            torch.cuda.set_sync_debug_mode(0)
        finally:
            if self._catcher is not None:
                self._catcher.__exit__(None, None, None)
                self._catcher = None
                self._tally()

    def _tally(self) -> None:
        for w in self._log:
            if "synchroniz" in str(w.message):
                self.count += 1
                where = w.filename
                if where.startswith(REPO):
                    where = os.path.relpath(where, REPO)
                self.sites[f"{where}:{w.lineno}"] += 1
        self._log = []


@dataclass
class Measurement:
    """One run's window: wall seconds, peak allocated device memory (GiB; NaN on a CPU),
    and the host syncs of a counting pass (None in a timing pass)."""

    seconds: float = float("nan")
    #: from the window's start to the return of the last step's host work (before the
    #: closing synchronization): the host's launch time for the window
    host_seconds: float = float("nan")
    #: the end of each step (``per_step`` windows: the device synchronized at each)
    step_ends: list[float] = field(default_factory=list)
    peak_gib: float = float("nan")
    syncs: int | None = None
    sites: dict[str, int] = field(default_factory=dict)
    final_loss: float = float("nan")
    start_gib: float = float("nan")


class Window:
    """The measured steps: opened at the end of the last warm-up step, closed at the end
    of the last step. Times them (device synchronized at both edges), or, with a
    :class:`SyncCounter`, counts their host syncs instead (no synchronization added)."""

    def __init__(
        self, device: torch.device, counter: SyncCounter | None, per_step: bool = False
    ) -> None:
        self.device = device
        self.counter = counter
        #: synchronize and record the time at the end of every step (stable-pretraining's
        #: way of counting samples/s; adds a host wait per step)
        self.per_step = per_step
        self.result = Measurement()
        self._start = 0.0

    def open(self) -> None:
        if self.counter is not None:
            self.counter.start()
            return
        tso.synchronize(self.device)
        self._start = time.perf_counter()
        if self.per_step:
            self.result.step_ends.append(self._start)

    def step_end(self) -> None:
        """The end of a step inside the window (``per_step`` windows only)."""
        if self.per_step and self.counter is None:
            tso.synchronize(self.device)
            self.result.step_ends.append(time.perf_counter())

    def close(self, loss: torch.Tensor | None) -> None:
        """End the window; ``loss`` (the last step's) is read after it."""
        if self.counter is not None:
            self.counter.stop()
            self.result.syncs = self.counter.count
            self.result.sites = dict(self.counter.sites)
        else:
            self.result.host_seconds = time.perf_counter() - self._start
            tso.synchronize(self.device)
            self.result.seconds = time.perf_counter() - self._start
            if self.device.type == "cuda":
                self.result.peak_gib = torch.cuda.max_memory_allocated(self.device) / 2**30
        if loss is not None:
            self.result.final_loss = float(loss.detach().float().item())


class WindowHook(VisslHook):
    """The trainer side of :class:`Window`, after every other ``on_step`` hook."""

    priority = tso.WindowTimerHook.priority

    def __init__(self, window: Window, warmup: int, steps: int) -> None:
        self.window = window
        self.first = warmup
        self.last = warmup + steps

    def on_step(self, task: Any) -> None:
        iteration = task.iteration
        if iteration == self.first:
            self.window.open()
        elif self.first < iteration <= self.last:
            self.window.step_end()
            if iteration == self.last:
                self.window.close(task.last_batch.loss)

    def on_exception(self, task: Any) -> None:
        if self.window.counter is not None:
            self.window.counter.stop()


class SettingsCheckHook(VisslHook):
    """Fails the run when the trainer ignores bf16 or ``MODEL.CHANNELS_LAST``."""

    def __init__(self, channels_last: bool, bf16: bool) -> None:
        self.channels_last = channels_last
        self.bf16 = bf16

    def on_start(self, task: Any) -> None:
        tso.check_trainer_supports(task, channels_last=self.channels_last, bf16=self.bf16)


def _fresh_memory(device: torch.device) -> float:
    """Free what the last run left and restart the peak-memory statistics; the memory
    still allocated (GiB; NaN on a CPU): the in-memory batch, or a leak."""
    gc.collect()
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device) / 2**30


# ---------------------------------------------------------------------- vissl
def run_vissl(
    cfg: Any,
    args: argparse.Namespace,
    device: torch.device,
    batch: dict[str, Any] | None,
    counter: SyncCounter | None = None,
    per_step: bool = False,
) -> Measurement:
    """The train engine in this process (``launch_distributed``, one process), with the
    config's default hooks; in-memory workloads get ``batch`` at every step."""
    from vissl.hooks import default_hook_generator
    from vissl.utils.distributed_launcher import launch_distributed

    folder = str(cfg.CHECKPOINT.DIR)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    total = args.warmup + args.steps
    window = Window(device, counter, per_step)
    extra: list[Any] = [
        SettingsCheckHook(bool(cfg.MODEL.CHANNELS_LAST), not args.fp32),
        WindowHook(window, args.warmup, args.steps),
    ]
    if batch is not None:
        extra.append(tso.InMemoryBatchesHook([batch], total, check_channels_last=False))

    def hooks(config: Any) -> list[Any]:
        return [*default_hook_generator(config), *extra]

    window.result.start_gib = _fresh_memory(device)
    quiet = tso._quiet_stdout() if args.quiet else contextlib.nullcontext()
    with quiet:
        launch_distributed(cfg, node_id=0, engine_name="train", hook_generator=hooks)
    if math.isnan(window.result.seconds) and window.result.syncs is None:
        raise RuntimeError("the trainer did not reach the end of the measured window")
    return window.result


# ---------------------------------------------------------------------- the hand loop
def _host_loader(cfg: Any, device: torch.device) -> tuple[Any, Any]:
    """The real loader (the same builder and sampler as the trainer's) and the colour
    tail of ``TRANSFORMS_ON_DEVICE`` (None without it)."""
    from vissl.data import build_dataset, get_loader

    dataset = build_dataset(cfg, "TRAIN")
    tail = None
    if bool(cfg.DATA.TRAIN.get("TRANSFORMS_ON_DEVICE", False)):
        # what the task stores in task.device_transforms["TRAIN"], built the same way
        tail = dataset.move_transforms_to_device()
    loader = get_loader(
        dataset,
        cfg,
        "TRAIN",
        num_replicas=1,
        rank=0,
        seed=int(cfg.SEED_VALUE),
        device_is_cuda=device.type == "cuda",
    )
    loader.sampler.set_epoch(0)
    return loader, tail


def run_hand(
    cfg: Any,
    args: argparse.Namespace,
    device: torch.device,
    batch: dict[str, Any] | None,
    counter: SyncCounter | None = None,
    per_step: bool = False,
) -> Measurement:
    """A plain PyTorch loop over vissl's model, loss and optimizer, built from ``cfg``.

    Per step: the learning rate and weight decay of each group from a table made ahead
    (as DINO's own loop does), ``zero_grad``, forward (and the teacher's, for DINO and
    iBOT: the loss's ``teacher_loss_inputs``, as a plain loop calls it) and loss under
    autocast, backward, the config's frozen parameters and gradient clipping (the
    config's ``MODE``: one global norm, or each parameter's own norm as DINO's and iBOT's
    ``clip_gradients``), ``step``, the teacher's EMA (one foreach lerp). Barlow's batches
    come from the same loader and device tail as the trainer's.
    """
    from vissl.data.batch import move_to_device
    from vissl.engines.train import set_seeds
    from vissl.hooks.state_update_hooks import parse_frozen_params_map, resolve_parameter_name
    from vissl.losses import build_loss
    from vissl.models import build_model
    from vissl.models.momentum import TeacherStep, schedule_position
    from vissl.optimizers import build_optimizer, build_param_schedulers
    from vissl.utils.env import apply_cuda_backend_settings

    start_gib = _fresh_memory(device)
    if device.type == "cuda":
        apply_cuda_backend_settings(cfg)  # cudnn.benchmark, TF32: what the trainer sets
    set_seeds(cfg, 0)
    total = args.warmup + args.steps
    loader, tail = _host_loader(cfg, device) if batch is None else (None, None)
    channels_last = bool(cfg.MODEL.CHANNELS_LAST)
    input_keys = list(cfg.DATA.TRAIN.INPUT_KEY_NAMES)
    target_keys = list(cfg.DATA.TRAIN.TARGET_KEY_NAMES)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    loss_fn = build_loss(cfg.LOSS, cfg).to(device)
    driver = None
    if callable(getattr(loss_fn, "bind_model", None)):
        loss_fn.bind_model(model)
        driver = getattr(loss_fn, "momentum_teacher", None)
    model.train()
    loss_fn.train()
    schedulers = build_param_schedulers(
        cfg.OPTIMIZER,
        batch_size_per_replica=int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA),
        world_size=1,
        num_nodes=1,
    )
    optimizer = build_optimizer(cfg.OPTIMIZER, model, param_schedulers=schedulers)
    groups = optimizer.param_groups
    plan = []
    for i in range(total):
        schedulers.apply(optimizer, i / total, None)
        plan.append([(g["lr"], g["weight_decay"]) for g in groups])
    named = dict(model.named_parameters())
    frozen = []
    for n, iters in parse_frozen_params_map(
        list(cfg.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP or [])
    ).items():
        alias = resolve_parameter_name(n, model, named)
        if alias != "":
            frozen.append((named[alias or n], iters))
    clip = cfg.MODEL.GRAD_CLIP
    norm_type = float("inf") if str(clip.NORM_TYPE) == "inf" else float(clip.NORM_TYPE)
    per_parameter = str(clip.get("MODE", "global")) == "per_parameter"
    if clip.USE_GRAD_CLIP and str(clip.get("MODE", "global")) not in ("global", "per_parameter"):
        raise SystemExit(f"the hand loop clips globally or per parameter, not {clip.MODE}")
    max_norm = float(clip.MAX_NORM)
    params = list(model.parameters())
    if driver is not None:
        ema_target = [p.data for p in driver.module.parameters()]
        ema_source = [p.detach() for p in model.parameters()]
    autocast: Any = (
        contextlib.nullcontext
        if args.fp32
        else lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    )

    def pick(b: dict[str, Any], keys: list[str]) -> Any:
        return b[keys[0]][0] if len(keys) == 1 else {k: b[k][0] for k in keys}

    # the workers start here, after the model is built, as in the trainer's phase start
    batches: Iterator[Any] = iter(loader) if loader is not None else itertools.repeat(batch, total)
    window = Window(device, counter, per_step)
    window.result.start_gib = start_gib
    loss = torch.zeros(())
    try:
        for i in range(total):
            if i == args.warmup:
                window.open()
            b = next(batches)
            x, target = pick(b, input_keys), pick(b, target_keys)
            if batch is None:  # to the device as the trainer's read_sample does
                x, target = move_to_device(x, device), move_to_device(target, device)
                if tail is not None:
                    x = tail(x, b["data_idx"][0].to(device, non_blocking=True), 0)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            for g, (lr, wd) in zip(groups, plan[i]):
                g["lr"] = lr
                g["weight_decay"] = wd
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                out = model(x)
                if isinstance(out, list | tuple) and len(out) == 1:
                    out = out[0]
                if driver is not None:
                    with torch.no_grad():
                        inputs = loss_fn.teacher_loss_inputs(
                            {"input": x, "target": target}, TeacherStep(i, 0, True, channels_last)
                        )
                    result = loss_fn(out, target, **inputs)
                else:
                    result = loss_fn(out, target)
                loss = result["loss"] if isinstance(result, dict) else result
            loss.backward()
            for p, iters in frozen:
                if i < iters:
                    p.grad = None
            if clip.USE_GRAD_CLIP:
                grads = [p.grad for p in params if p.grad is not None]
                if per_parameter:
                    norms = torch.stack(torch._foreach_norm(grads, norm_type))
                    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
                    torch._foreach_mul_(grads, list(scale.unbind()))
                else:
                    torch.nn.utils.clip_grad_norm_(
                        [p for p in params if p.grad is not None], max_norm, norm_type=norm_type
                    )
            optimizer.step()
            if driver is not None:
                m = driver.momentum_at(schedule_position(i, total))
                torch._foreach_lerp_(ema_target, ema_source, 1.0 - m)
            if i >= args.warmup:
                window.step_end()
    except BaseException:
        if counter is not None:
            counter.stop()
        raise
    window.close(loss.detach())
    return window.result


# ---------------------------------------------------------------------- report
#: the order of the variants in each round: every variant in every position, each round
#: the previous one reversed or rotated (interleaved and alternating)
ORDERS = (
    ("vissl", "hand", "hand_aa"),
    ("hand_aa", "hand", "vissl"),
    ("hand", "hand_aa", "vissl"),
    ("vissl", "hand_aa", "hand"),
    ("hand_aa", "vissl", "hand"),
    ("hand", "vissl", "hand_aa"),
)


def round_order(r: int) -> tuple[str, ...]:
    """The order of the variants in round ``r`` (0-based)."""
    return ORDERS[r % len(ORDERS)]


@dataclass
class WorkloadResult:
    """Every run of one workload."""

    name: str
    title: str
    batch: int
    runs: dict[str, list[Measurement]]
    counts: dict[str, Measurement]
    #: stable-pretraining's convention (barlow): one per-step synchronized run per variant
    spt: dict[str, Measurement] = field(default_factory=dict)

    def images_per_s(self, variant: str, steps: int) -> list[float]:
        return [self.batch * steps / m.seconds for m in self.runs[variant]]

    def ratios(self, variant: str, steps: int, against: str = "hand") -> list[float]:
        """Per round: ``variant`` images/s over ``against``'s."""
        pairs = zip(self.images_per_s(variant, steps), self.images_per_s(against, steps))
        return [v / h for v, h in pairs]

    def ratio(self, steps: int) -> float:
        """Median over rounds of vissl/hand images/s."""
        return statistics.median(self.ratios("vissl", steps))

    def floor(self, steps: int) -> float:
        """The noise floor: the largest distance from 1 of the A/A ratio (the hand loop
        against itself, hand_aa/hand) over the rounds."""
        return max(abs(r - 1.0) for r in self.ratios("hand_aa", steps))

    def verdict(self, steps: int) -> str:
        """The gap vissl/hand against the noise floor; a verdict only outside it."""
        gap = self.ratio(steps) - 1.0
        floor = self.floor(steps)
        if abs(gap) <= floor:
            return f"within the noise floor (gap {100 * gap:+.1f}%, floor +-{100 * floor:.1f}%)"
        side = "slower" if gap < 0 else "faster"
        return (
            f"vissl {side} than the hand loop by {100 * abs(gap):.1f}% (outside the "
            f"floor of +-{100 * floor:.1f}%)"
        )

    def ms_per_step(self, variant: str, steps: int, host: bool = False) -> float:
        values = [(m.host_seconds if host else m.seconds) for m in self.runs[variant]]
        return 1000.0 * statistics.median(values) / steps

    def peak(self, variant: str) -> float:
        return max(m.peak_gib for m in self.runs[variant])

    def syncs_per_step(self, variant: str, steps: int) -> float | None:
        m = self.counts.get(variant)
        return None if m is None or m.syncs is None else m.syncs / steps

    def spt_samples_per_s(self, variant: str) -> float | None:
        """stable-pretraining's samples/s: batch / mean step time (per-step synchronized)."""
        m = self.spt.get(variant)
        if m is None or len(m.step_ends) < 2:
            return None
        ends = m.step_ends
        steps = [b - a for a, b in itertools.pairwise(ends)]
        return self.batch / statistics.mean(steps)


def _where(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def _spread(values: Sequence[float], digits: int = 1) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def format_report(
    args: argparse.Namespace, device: torch.device, results: Sequence[WorkloadResult]
) -> str:
    """The markdown table and the lines around it, as printed."""
    precision = "fp32" if args.fp32 else "bf16 autocast"
    batches = " / ".join(f"{r.name} {r.batch}" for r in results)
    steps = args.steps
    lines = [
        f"gpu_report: {_where(device)}, torch {torch.__version__}, {precision}, batch per GPU "
        f"{batches}, {steps} timed steps after {args.warmup} warm-up, {args.rounds} "
        f"interleaved round(s) in rotating order{', tiny sizes' if args.tiny else ''}",
        "",
        "| workload | variant | images/s per GPU | spread (min-max) | ratio to hand loop "
        "[min, max] | wall ms/step | host ms/step | peak memory (GiB) | host syncs/step |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for v in VARIANTS:
            ips = r.images_per_s(v, steps)
            peak = r.peak(v)
            syncs = r.syncs_per_step(v, steps)
            if v == "hand":
                ratio = "1.000"
            else:
                rs = r.ratios(v, steps)
                ratio = f"{statistics.median(rs):.3f} [{min(rs):.3f}, {max(rs):.3f}]"
            cells = [
                r.title,
                VARIANT_LABELS[v],
                f"{statistics.median(ips):.1f}",
                _spread(ips),
                ratio,
                f"{r.ms_per_step(v, steps):.2f}",
                f"{r.ms_per_step(v, steps, host=True):.2f}",
                "n/a" if math.isnan(peak) else f"{peak:.2f}",
                "n/a" if syncs is None else f"{syncs:.2f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "images/s: samples per second over the window (a sample is all its views or crops), "
        "median over rounds; ratio: per round, images/s over the hand loop's of the same "
        "round, median [min, max]; the hand loop (A/A) is the hand loop run again, its "
        "ratio's largest distance from 1 is the noise floor; host ms/step: from the window's "
        "start to the end of the last step's host work, before the closing synchronization; "
        "host syncs: per timed step, counted in a separate pass with "
        "torch.cuda.set_sync_debug_mode('warn') (no log step in the window)",
    ]
    for r in results:
        for v in VARIANTS:
            m = r.counts.get(v)
            if m is not None and m.sites:
                top = ", ".join(f"{s} x{n}" for s, n in Counter(m.sites).most_common(4))
                lines.append(f"host syncs of {r.name} {VARIANT_LABELS[v]}: {top}")
    for r in results:
        last = {v: r.runs[v][-1].final_loss for v in VARIANTS}
        same = "identical" if len(set(last.values())) == 1 else "different"
        lines.append(
            f"final loss of the last round, {r.name}: vissl {last['vissl']:.6f}, hand loop "
            f"{last['hand']:.6f}, A/A {last['hand_aa']:.6f} ({same})"
        )
    for r in results:
        lines.append(f"verdict, {r.name}: {r.verdict(steps)}")
    for r in results:
        if r.spt:
            figures = ", ".join(
                f"{VARIANT_LABELS[v]} {x:.1f}"
                for v in ("vissl", "hand")
                if (x := r.spt_samples_per_s(v)) is not None
            )
            lines.append(f"samples/s of {r.name} as stable-pretraining counts them: {figures}")
            lines.append(f"  ({SPT_CONVENTION}; one run per variant)")
    if any(r.name == "barlow" for r in results):
        lines.append(f"anchor: {ANCHOR}")
    lines.append(
        "gpu_report: "
        + ", ".join(
            f"{r.name} vissl/hand {r.ratio(steps):.3f} (floor {r.floor(steps):.3f})"
            for r in results
        )
    )
    return "\n".join(lines)


def to_json(
    args: argparse.Namespace, device: torch.device, results: Sequence[WorkloadResult]
) -> dict[str, Any]:
    def nan_to_none(x: float) -> float | None:
        return None if math.isnan(x) else x

    steps = args.steps
    return {
        "device": _where(device),
        "torch": torch.__version__,
        "precision": "fp32" if args.fp32 else "bf16",
        "steps": steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "orders": [list(round_order(r)) for r in range(args.rounds)],
        "tiny": args.tiny,
        "anchor": ANCHOR,
        "spt_convention": SPT_CONVENTION,
        "workloads": {
            r.name: {
                "title": r.title,
                "batch": r.batch,
                "ratio": r.ratio(steps),
                "ratios": r.ratios("vissl", steps),
                "aa_ratios": r.ratios("hand_aa", steps),
                "noise_floor": r.floor(steps),
                "verdict": r.verdict(steps),
                "spt_samples_per_s": {
                    v: r.spt_samples_per_s(v) for v in ("vissl", "hand") if v in r.spt
                },
                **{
                    v: {
                        "images_per_s": r.images_per_s(v, steps),
                        "median_images_per_s": statistics.median(r.images_per_s(v, steps)),
                        "wall_ms_per_step": r.ms_per_step(v, steps),
                        "host_ms_per_step": r.ms_per_step(v, steps, host=True),
                        "peak_gib": nan_to_none(r.peak(v)),
                        "syncs_per_step": r.syncs_per_step(v, steps),
                        "sync_sites": r.counts[v].sites if v in r.counts else {},
                        "final_loss": r.runs[v][-1].final_loss,
                    }
                    for v in VARIANTS
                },
            }
            for r in results
        },
    }


def in_memory_batch(cfg: Any, name: str, device: torch.device) -> dict[str, Any] | None:
    """The batch every step of an in-memory workload reads (None: the real loader)."""
    if name in LOADER_WORKLOADS:
        return None
    if name in COLLATED_WORKLOADS:
        return make_collated_batch(cfg, device)
    return make_batch(cfg, device)


# ---------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every workload, print the report and return it (``table``, ``json``)."""
    args = parse_args(argv)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if args.device == "cuda"
        else torch.device("cpu")
    )
    began = time.perf_counter()
    results: list[WorkloadResult] = []
    workdir = tempfile.mkdtemp(prefix="vissl_gpu_report_")
    run = {"vissl": run_vissl, "hand": run_hand, "hand_aa": run_hand}

    def stamp() -> str:
        return f"[{time.perf_counter() - began:7.1f} s]"

    try:
        for name in args.workloads:
            cfg = compose(args, name, os.path.join(workdir, name))
            batch = in_memory_batch(cfg, name, device)
            result = WorkloadResult(
                name,
                workload_title(args, name, cfg),
                args.batch[name],
                {v: [] for v in VARIANTS},
                {},
            )
            for r in range(args.rounds):
                for v in round_order(r):
                    m = run[v](cfg, args, device, batch)
                    result.runs[v].append(m)
                    memory = (
                        ""
                        if math.isnan(m.peak_gib)
                        else f", peak {m.peak_gib:.2f} GiB ({m.start_gib:.2f} allocated before)"
                    )
                    print(
                        f"{stamp()} {name} round {r + 1}/{args.rounds} "
                        f"{VARIANT_LABELS[v]}: {result.batch * args.steps / m.seconds:.1f} "
                        f"images/s{memory}",
                        flush=True,
                    )
            if device.type == "cuda" and not args.no_count:
                for v in ("vissl", "hand"):
                    m = run[v](cfg, args, device, batch, SyncCounter())
                    result.counts[v] = m
                    print(
                        f"{stamp()} {name} {VARIANT_LABELS[v]}: {m.syncs} host syncs in "
                        f"{args.steps} steps",
                        flush=True,
                    )
            if name == "barlow" and not args.no_spt:
                for v in ("vissl", "hand"):
                    result.spt[v] = run[v](cfg, args, device, batch, None, True)
                    print(
                        f"{stamp()} {name} {VARIANT_LABELS[v]}: "
                        f"{result.spt_samples_per_s(v):.1f} samples/s (stable-pretraining's "
                        "convention)",
                        flush=True,
                    )
            results.append(result)
            del batch
            _fresh_memory(device)
        table = format_report(args, device, results)
        print("\n" + table, flush=True)
        report = to_json(args, device, results)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=2)
        return {"table": table, "json": report, "results": results}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

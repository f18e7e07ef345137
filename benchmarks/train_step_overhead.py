"""How much does vissl's trainer add to a training step? (the ``train_step_overhead`` benchmark)

The same model, the same batches held in memory, the same optimizer and seed, three ways:

(a) a hand-written PyTorch loop: ``zero_grad``, forward, loss, backward, ``step``, and a
    ``loss.item()`` on the iterations vissl logs (the 1st and every ``LOG_FREQUENCY``-th),
    to match the device read of logging;
(b) vissl's trainer (``launch_distributed`` -> ``train`` engine -> ``standard_train_step``)
    with the default hooks of the config and ``LOG_FREQUENCY`` 10;
(c) (b) with ``HOOKS.PERF_STATS.MONITOR_PERF_STATS`` on.

Every side is built from one composed and validated vissl config (``tiny_supervised``
with synthetic images of ``--image-size``, one process, no data loader workers, no
meters, no test phase): the model from ``vissl.models.build_model``, the loss from
``vissl.losses.build_loss``, the optimizer (and its initial learning rates) from
``vissl.optimizers.build_optimizer``, seeded with ``SEED_VALUE`` as the train engine does.
The batches are collated once by vissl's data loader and kept in memory (on the device);
the trainer gets them through a hook that swaps ``task.data_iterator`` at phase start, so
data loading is counted on neither side. The final losses of (a) and (b) are printed: they
match when both sides did the same arithmetic.

**What is timed.** The steady-state window only: from the end of the last warm-up step to
the end of the last step, i.e. ``--steps`` whole iterations *including* their ``on_step``
hooks on the trainer side (the timing hook runs after every other hook). Excluded on both
sides: building the model, optimizer and task, the warm-up steps (first-iteration
allocations, autograd and oneDNN/cuDNN caches), and on the trainer side the phase end (meter
sync, metrics.json, the final checkpoint write) and ``on_end``. Those are one-off costs
that do not scale with the number of steps and would swamp a short benchmark. On CUDA the
window edges synchronize the device on both sides.

Variants run interleaved (the order rotates every round), ``--rounds`` times; the table
shows medians, the ratios b/a and c/b (of medians, and the median of the per-round ratios,
which is robust against machine-wide drift) and images/s. A separate, untimed pass of (a)
and (b) counts device reads per timed step: calls of ``Tensor.item``, ``tolist``,
``__bool__``, ``__float__``, ``__int__``, ``cpu`` and ``numpy`` (on CUDA also the
synchronizations reported by ``torch.cuda.set_sync_debug_mode("warn")``).

**Tiny mode** (``--model tiny``): a two-layer MLP (trunk ``benchmark_tiny_mlp``, registered
by this script, then vissl's ``mlp`` head) on 8 px images in batches of 8, so that a step
of the hand loop takes well under a millisecond and the trainer's own per-step work
dominates the difference. It defaults to 1000 timed steps after 50 warm-up, and the
summary line reads ``added <x> ms/step``: the median over rounds of ``(b - a) / steps``,
the time vissl's trainer adds to every step.

The last line of the output is ``train_step_overhead: added <x> ms/step (b/a <r>)``: the
median of the per-round differences and ratios of (b) against (a).

Usage::

    python benchmarks/train_step_overhead.py                       # CPU, ResNet-18 at 32 px
    python benchmarks/train_step_overhead.py --model tiny          # the framework's own cost
    python benchmarks/train_step_overhead.py --device cuda --model resnet50 \\
        --image-size 224 --batch-size 128 --bf16 --channels-last   # GPU
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.hooks.base import Priority, VisslHook

BASE_CONFIG = "test/cpu_test/tiny_supervised"
VARIANTS = ("a", "b", "c")
LABELS = {
    "a": "(a) hand-written PyTorch loop",
    "b": "(b) vissl trainer, default hooks",
    "c": "(c) (b) + perf stats",
}
#: Tensor methods that read a value back from the device (a sync on CUDA).
DEVICE_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")
_MODELS = {"resnet18": (18, 512), "resnet50": (50, 2048)}
#: ``--model tiny``: trunk name, hidden width, and the defaults it changes.
TINY_TRUNK = "benchmark_tiny_mlp"
TINY_HIDDEN = 32
#: per-model defaults of the flags left unset (``None``) on the command line.
_DEFAULTS: dict[str, dict[str, int]] = {
    "resnet18": {"image_size": 32, "batch_size": 32, "steps": 50, "warmup": 10},
    "resnet50": {"image_size": 32, "batch_size": 32, "steps": 50, "warmup": 10},
    "tiny": {"image_size": 8, "batch_size": 8, "steps": 1000, "warmup": 50},
}


#: input side of the tiny trunk (``--image-size``), set by :func:`register_tiny_trunk`.
_tiny_image_size = 8


def register_tiny_trunk(image_size: int) -> None:
    """Register the ``--model tiny`` trunk (flatten, linear, ReLU) once per process."""
    from torch import nn

    from vissl.models.trunks import MODEL_TRUNKS_REGISTRY, register_model_trunk

    global _tiny_image_size
    _tiny_image_size = image_size
    if TINY_TRUNK in MODEL_TRUNKS_REGISTRY:
        return

    @register_model_trunk(TINY_TRUNK)
    class TinyMlpTrunk(nn.Module):
        """``flatten -> linear -> ReLU`` on the image; a step costs tens of microseconds."""

        def __init__(self, model_config: Any, model_name: str = TINY_TRUNK) -> None:
            super().__init__()
            self.layer = nn.Linear(3 * _tiny_image_size**2, TINY_HIDDEN)

        def forward(self, x: torch.Tensor, out_feat_keys: Any = None) -> list[torch.Tensor]:
            return [torch.relu(self.layer(x.flatten(1)))]


# ---------------------------------------------------------------------- configuration
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags (see the module docstring)."""
    p = argparse.ArgumentParser(
        description="Per-step overhead of vissl's trainer against a hand-written loop."
    )
    p.add_argument(
        "--model",
        choices=[*sorted(_MODELS), "tiny"],
        default="resnet18",
        help="tiny: a two-layer MLP on 8 px images, a step of well under 1 ms (the "
        "framework's own cost dominates)",
    )
    p.add_argument(
        "--width-multiplier",
        type=float,
        default=1.0,
        help="MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER (a multiple of 1/64; < 1 for a quick run)",
    )
    p.add_argument("--image-size", type=int, default=None, help="default 32 (tiny: 8)")
    p.add_argument("--batch-size", type=int, default=None, help="default 32 (tiny: 8)")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument(
        "--steps", type=int, default=None, help="timed steps per run (default 50; tiny: 1000)"
    )
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed steps before the window (10; tiny: 50)"
    )
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds of a, b, c")
    p.add_argument("--log-frequency", type=int, default=10, help="config.LOG_FREQUENCY")
    p.add_argument(
        "--lr", type=float, default=0.01, help="constant learning rate (small: no divergence)"
    )
    p.add_argument(
        "--distinct-batches",
        type=int,
        default=8,
        help="distinct batches held in memory, cycled over (0: one per step)",
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--bf16", action="store_true", help="MODEL.AMP_PARAMS bfloat16 autocast")
    p.add_argument("--channels-last", action="store_true", help="MODEL.CHANNELS_LAST")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    p.add_argument(
        "--tensorboard", action="store_true", help="also turn on the TensorBoard hook in (b)/(c)"
    )
    p.add_argument("--no-count", action="store_true", help="skip the device-read count pass")
    p.add_argument(
        "--quiet", action="store_true", help="hide the trainer's log lines (stdout only)"
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        help="extra config override for every side, e.g. config.HOOKS.CHECK_NAN=False",
    )
    args = p.parse_args(argv)
    for name, value in _DEFAULTS[args.model].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.model == "tiny" and args.width_multiplier != 1.0:
        p.error("--width-multiplier applies to the ResNets, not to --model tiny")
    for name in ("image_size", "batch_size", "steps", "rounds", "log_frequency", "num_classes"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 1:
        p.error("--warmup must be >= 1 (the timing window starts at the end of a step)")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available on this machine")
    return args


def config_overrides(args: argparse.Namespace, checkpoint_dir: str, perf_stats: bool) -> list[str]:
    """Hydra overrides of the benchmark's config (shared by all three sides)."""
    total = args.warmup + args.steps
    overrides = [
        f"config={BASE_CONFIG}",
        "config.TEST_MODEL=False",
        "config.SEED_VALUE=0",
        f"config.LOG_FREQUENCY={args.log_frequency}",
        "config.DATA.NUM_DATALOADER_WORKERS=0",
        "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
        f"config.DATA.TRAIN.DEFAULT_GRAY_IMG_SIZE={args.image_size}",
        "config.DATA.TRAIN.TRANSFORMS=[{name: ToTensor}]",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch_size}",
        # len(loader) == warm-up + timed steps, so max_iteration and the schedules match
        f"config.DATA.TRAIN.DATA_LIMIT={args.batch_size * total}",
        "config.DATA.TRAIN.DROP_LAST=True",
        # the hand loop computes no accuracy; training meters would be extra work
        "config.METERS.names=[]",
        *model_overrides(args),
        "config.OPTIMIZER.num_epochs=1",
        f"config.OPTIMIZER.param_schedulers.lr.value={args.lr}",
        f"config.MACHINE.DEVICE={'gpu' if args.device == 'cuda' else 'cpu'}",
        f"config.HOOKS.PERF_STATS.MONITOR_PERF_STATS={perf_stats}",
        f"config.CHECKPOINT.DIR={checkpoint_dir}",
        "config.CHECKPOINT.OVERWRITE_EXISTING=True",
        "config.CHECKPOINT.AUTO_RESUME=False",
    ]
    if args.bf16:
        overrides += [
            "config.MODEL.AMP_PARAMS.USE_AMP=True",
            "config.MODEL.AMP_PARAMS.AMP_TYPE=pytorch",
            "config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16",
        ]
    if args.channels_last:
        overrides.append("config.MODEL.CHANNELS_LAST=True")
    if args.tensorboard:
        overrides.append("config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=True")
    return overrides + list(args.override)


def model_overrides(args: argparse.Namespace) -> list[str]:
    """The ``config.MODEL`` overrides of ``--model`` (and ``--width-multiplier``)."""
    if args.model == "tiny":
        register_tiny_trunk(args.image_size)
        return [
            f"config.MODEL.TRUNK.NAME={TINY_TRUNK}",
            f"config.MODEL.HEAD.PARAMS=[[mlp, {{dims: [{TINY_HIDDEN}, {args.num_classes}]}}]]",
        ]
    depth, feat_dim = _MODELS[args.model]
    feat_dim = round(feat_dim * args.width_multiplier)
    return [
        f"config.MODEL.TRUNK.RESNETS.DEPTH={depth}",
        f"config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER={args.width_multiplier}",
        f"config.MODEL.HEAD.PARAMS=[[mlp, {{dims: [{feat_dim}, {args.num_classes}]}}]]",
    ]


def compose(args: argparse.Namespace, checkpoint_dir: str, perf_stats: bool) -> AttrDict:
    """The validated ``config`` section for one side."""
    from vissl.utils.hydra_config import hydra_compose_and_validate

    _, cfg = hydra_compose_and_validate(config_overrides(args, checkpoint_dir, perf_stats))
    return cfg


def make_batches(cfg: AttrDict, args: argparse.Namespace, device: torch.device) -> list[Any]:
    """The batch dicts, collated by vissl's loader once and kept in memory on ``device``."""
    from vissl.data import build_dataset, get_loader
    from vissl.data.batch import move_to_device

    loader = get_loader(
        build_dataset(cfg, "TRAIN"),
        cfg,
        "TRAIN",
        num_replicas=1,
        rank=0,
        seed=int(cfg.SEED_VALUE),
        device_is_cuda=device.type == "cuda",
    )
    total = args.warmup + args.steps
    if len(loader) != total:
        raise RuntimeError(f"the loader has {len(loader)} batches, expected {total}")
    wanted = total if args.distinct_batches <= 0 else min(total, args.distinct_batches)
    batches = []
    for batch in loader:
        batches.append(move_to_device(batch, device))
        if len(batches) == wanted:
            break
    return batches


def batch_stream(batches: Sequence[Any], total: int) -> Iterator[Any]:
    """``total`` batches, cycling over the distinct ones held in memory."""
    return (batches[i % len(batches)] for i in range(total))


def is_log_iteration(iteration: int, log_frequency: int) -> bool:
    """The iterations on which vissl's logging hooks read the loss (1-based)."""
    return iteration == 1 or iteration % max(1, log_frequency) == 0


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------- device reads
@dataclass
class ReadCounter:
    """Counts device reads (Tensor methods in :data:`DEVICE_READS`) while ``active``."""

    active: bool = False
    counts: Counter[str] = field(default_factory=Counter)
    cuda_syncs: int = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[ReadCounter]:
        """Wrap the Tensor methods for the duration of the block."""
        saved: dict[str, tuple[bool, Any]] = {}
        for name in DEVICE_READS:
            original = getattr(torch.Tensor, name)
            saved[name] = (name in torch.Tensor.__dict__, original)
            setattr(torch.Tensor, name, self._wrap(name, original))
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield self
            self.cuda_syncs += sum(
                "synchroniz" in str(w.message).lower() for w in caught if w is not None
            )
        finally:
            for name, (own, original) in saved.items():
                if own:
                    setattr(torch.Tensor, name, original)
                else:
                    delattr(torch.Tensor, name)

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self.active:
                self.counts[name] += 1
            return original(tensor, *args, **kwargs)

        wrapper.__name__ = name
        return wrapper

    def start(self, device: torch.device) -> None:
        self.active = True
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")

    def stop(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
        self.active = False


# ---------------------------------------------------------------------- (a) the hand loop
@dataclass
class RunResult:
    """One run's timing window.

    Attributes:
        seconds: wall-clock seconds of the window.
        cpu_seconds: process CPU seconds of the window.
        final_loss: the loss of the last step.
        step_ends: ``perf_counter`` at the window start, then at the end of every timed
            step (for the per-block statistic).
    """

    seconds: float
    cpu_seconds: float
    final_loss: float
    step_ends: list[float] = field(default_factory=list)

    def block_seconds(self, block: int) -> list[float]:
        """Durations of consecutive blocks of ``block`` steps (each holds one log step)."""
        ends = self.step_ends
        return [ends[i + block] - ends[i] for i in range(0, len(ends) - block, block)]


def run_hand_loop(
    cfg: AttrDict,
    args: argparse.Namespace,
    batches: Sequence[Any],
    device: torch.device,
    counter: ReadCounter | None = None,
) -> RunResult:
    """(a): plain PyTorch over vissl's model, loss and optimizer."""
    from vissl.engines.train import set_seeds
    from vissl.losses import build_loss
    from vissl.models import build_model
    from vissl.optimizers import build_optimizer, build_param_schedulers

    set_seeds(cfg, 0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER).to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    loss_fn = build_loss(cfg.LOSS).to(device)
    schedulers = build_param_schedulers(
        cfg.OPTIMIZER,
        batch_size_per_replica=int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA),
        world_size=1,
        num_nodes=1,
    )
    optimizer = build_optimizer(cfg.OPTIMIZER, model, param_schedulers=schedulers)
    model.train()
    input_key = cfg.DATA.TRAIN.INPUT_KEY_NAMES[0]
    target_key = cfg.DATA.TRAIN.TARGET_KEY_NAMES[0]
    log_frequency = int(cfg.LOG_FREQUENCY)

    def autocast() -> contextlib.AbstractContextManager[Any]:
        if args.bf16:
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    loss = torch.zeros(())
    start = cpu_start = 0.0
    step_ends: list[float] = []
    for i, batch in enumerate(batch_stream(batches, args.warmup + args.steps)):
        if i == args.warmup:
            synchronize(device)
            if counter is not None:
                counter.start(device)
            start = time.perf_counter()
            cpu_start = time.process_time()
            step_ends.append(start)
        images = batch[input_key][0].to(device, non_blocking=True)
        target = batch[target_key][0].to(device, non_blocking=True)
        if args.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            output = model(images)
            if isinstance(output, list | tuple) and len(output) == 1:
                output = output[0]
            loss = loss_fn(output, target)
        loss.backward()
        optimizer.step()
        if is_log_iteration(i + 1, log_frequency):
            loss.item()
        if i >= args.warmup:
            step_ends.append(time.perf_counter())
    synchronize(device)
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    if counter is not None:
        counter.stop(device)
    return RunResult(seconds, cpu_seconds, float(loss.detach().float().item()), step_ends)


# ---------------------------------------------------------------------- (b), (c): the trainer
class InMemoryBatchesHook(VisslHook):
    """Feeds the in-memory batches: replaces ``task.data_iterator`` at phase start."""

    priority = Priority.HIGHEST - 100

    def __init__(self, batches: Sequence[Any], total: int, check_channels_last: bool) -> None:
        self.batches = batches
        self.total = total
        self.check_channels_last = check_channels_last

    def on_start(self, task: Any) -> None:
        if self.check_channels_last:
            check_trainer_supports(task, channels_last=True, bf16=False)

    def on_phase_start(self, task: Any) -> None:
        task.data_iterator = batch_stream(self.batches, self.total)


class WindowTimerHook(VisslHook):
    """Times iterations ``warmup + 1 .. warmup + steps``, after every other ``on_step``."""

    priority = Priority.LOWEST + 1000

    def __init__(
        self,
        warmup: int,
        steps: int,
        device: torch.device,
        counter: ReadCounter | None = None,
    ) -> None:
        self.first = warmup
        self.last = warmup + steps
        self.device = device
        self.counter = counter
        self.start = self.cpu_start = 0.0
        self.seconds = self.cpu_seconds = float("nan")
        self.final_loss: torch.Tensor | None = None
        self.step_ends: list[float] = []

    def on_step(self, task: Any) -> None:
        iteration = task.iteration
        if iteration == self.first:
            synchronize(self.device)
            if self.counter is not None:
                self.counter.start(self.device)
            self.start = time.perf_counter()
            self.cpu_start = time.process_time()
            self.step_ends.append(self.start)
            return
        if self.first < iteration <= self.last:
            self.step_ends.append(time.perf_counter())
        if iteration == self.last:
            synchronize(self.device)
            self.seconds = time.perf_counter() - self.start
            self.cpu_seconds = time.process_time() - self.cpu_start
            if self.counter is not None:
                self.counter.stop(self.device)
            self.final_loss = task.last_batch.loss


def check_trainer_supports(task: Any, *, channels_last: bool, bf16: bool) -> None:
    """Raise ConfigError when the trainer ignores a setting the benchmark asks for."""
    if channels_last:
        convs = [m for m in task.base_model.modules() if isinstance(m, torch.nn.Conv2d)]
        if convs and not all(
            m.weight.is_contiguous(memory_format=torch.channels_last) for m in convs
        ):
            raise ConfigError(
                "--channels-last: the trainer does not honour config.MODEL.CHANNELS_LAST yet "
                "(the model's conv weights are not channels_last after the task is built). "
                "Run without --channels-last.",
                "config.MODEL.CHANNELS_LAST",
            )
    if bf16 and getattr(task.precision, "name", "") != "bf16":
        raise ConfigError(
            "--bf16: the trainer did not pick bf16 precision from config.MODEL.AMP_PARAMS "
            f"(got {task.precision!r}).",
            "config.MODEL.AMP_PARAMS.AMP_DTYPE",
        )


def preflight(cfg: AttrDict, args: argparse.Namespace, device: torch.device) -> None:
    """Fail before any timing when the trainer cannot do what the flags ask."""
    if not (args.bf16 or args.channels_last):
        return
    from vissl.trainer.task import SelfSupervisionTask

    task = SelfSupervisionTask(cfg, str(cfg.CHECKPOINT.DIR), device).build()
    check_trainer_supports(task, channels_last=args.channels_last, bf16=args.bf16)


def run_trainer(
    cfg: AttrDict,
    args: argparse.Namespace,
    batches: Sequence[Any],
    device: torch.device,
    counter: ReadCounter | None = None,
) -> RunResult:
    """(b) or (c): the train engine in this process, with the config's default hooks."""
    from vissl.hooks import default_hook_generator
    from vissl.utils.distributed_launcher import launch_distributed

    folder = str(cfg.CHECKPOINT.DIR)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    timer = WindowTimerHook(args.warmup, args.steps, device, counter)
    feeder = InMemoryBatchesHook(batches, args.warmup + args.steps, args.channels_last)

    def hooks(config: Any) -> list[Any]:
        return [*default_hook_generator(config), feeder, timer]

    quiet = _quiet_stdout() if args.quiet else contextlib.nullcontext()
    with quiet:
        launch_distributed(cfg, node_id=0, engine_name="train", hook_generator=hooks)
    if timer.final_loss is None:
        raise RuntimeError("the trainer did not reach the end of the timing window")
    loss = float(timer.final_loss.detach().float().item())
    return RunResult(timer.seconds, timer.cpu_seconds, loss, timer.step_ends)


_DEVNULL: Any = None


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Send the trainer's stdout (its log lines included) to /dev/null for one run."""
    global _DEVNULL
    if _DEVNULL is None:
        _DEVNULL = open(os.devnull, "w", encoding="utf-8")  # kept open for the process
    try:
        with contextlib.redirect_stdout(_DEVNULL):
            yield
    finally:
        # the train engine's log handler was bound to /dev/null: drop it
        vissl_logger = logging.getLogger("vissl")
        for handler in list(vissl_logger.handlers):
            if getattr(handler, "stream", None) is _DEVNULL:
                vissl_logger.removeHandler(handler)


# ---------------------------------------------------------------------- report
def _fmt_row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
    )


def _ratio_line(
    name: str, num: Sequence[float], den: Sequence[float], steps: int, unit: str
) -> str:
    per_round = [n / d for n, d in zip(num, den)]
    med_n, med_d = statistics.median(num), statistics.median(den)
    return (
        f"  {name} {unit}: {med_n / med_d:.4f} of medians, {statistics.median(per_round):.4f} "
        f"median per round (range {min(per_round):.4f}-{max(per_round):.4f}); "
        f"{1000 * (med_n - med_d) / steps:+.3f} ms/step"
    )


def _p20(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=5)[0]


def format_table(
    args: argparse.Namespace,
    results: dict[str, list[RunResult]],
    reads: dict[str, ReadCounter],
    device: torch.device,
) -> str:
    """The result table, as printed."""
    images = args.batch_size * args.steps
    wall = {v: [r.seconds for r in results[v]] for v in VARIANTS}
    cpu = {v: [r.cpu_seconds for r in results[v]] for v in VARIANTS}
    block = max(1, min(args.log_frequency, args.steps))
    blocks = {v: [b for r in results[v] for b in r.block_seconds(block)] for v in VARIANTS}
    precision = "bf16 autocast" if args.bf16 else "fp32"
    width = f" (width x{args.width_multiplier:g})" if args.width_multiplier != 1 else ""
    layout = ", channels_last" if args.channels_last else ""
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    )
    lines = [
        f"train_step_overhead: {args.model}{width} @ {args.image_size}px, "
        f"batch {args.batch_size}, "
        f"{args.steps} timed steps after {args.warmup} warm-up, {args.rounds} interleaved rounds",
        f"device {device.type} ({where}), {precision}{layout}, torch {torch.__version__}, "
        f"LOG_FREQUENCY {args.log_frequency}",
        "",
    ]
    widths = (33, 9, 9, 9, 9, 10, 11, 13)
    head = (
        "variant",
        "wall s",
        "min s",
        "max s",
        "ms/step",
        "images/s",
        "cpu ms/step",
        "block ms/step",
    )
    lines.append(_fmt_row(head, widths))
    lines.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
    for v in VARIANTS:
        med = statistics.median(wall[v])
        med_cpu = statistics.median(cpu[v])
        med_block = statistics.median(blocks[v]) if blocks[v] else float("nan")
        cells = (
            LABELS[v],
            f"{med:.4f}",
            f"{min(wall[v]):.4f}",
            f"{max(wall[v]):.4f}",
            f"{1000 * med / args.steps:.3f}",
            f"{images / med:.1f}",
            f"{1000 * med_cpu / args.steps:.3f}",
            f"{1000 * med_block / block:.3f}",
        )
        lines.append(_fmt_row(cells, widths))
    lines.append(
        "medians over rounds; cpu: process CPU time of the window; block: median over all "
        f"rounds of the time of {block} consecutive steps"
        f"{' (one log step each)' if block == args.log_frequency else ''}, the statistic "
        "least disturbed by other load on a shared machine"
    )
    lines.append("")
    for num, den in (("b", "a"), ("c", "b")):
        lines.append(f"ratio {num}/{den}:")
        lines.append(_ratio_line(f"{num}/{den}", wall[num], wall[den], args.steps, "wall"))
        lines.append(_ratio_line(f"{num}/{den}", cpu[num], cpu[den], args.steps, "cpu "))
        if blocks[num] and blocks[den]:
            b_num, b_den = statistics.median(blocks[num]), statistics.median(blocks[den])
            lines.append(
                f"  {num}/{den} block: {b_num / b_den:.4f} of medians; "
                f"{1000 * (b_num - b_den) / block:+.3f} ms/step"
            )
        if len(blocks[num]) >= 5 and len(blocks[den]) >= 5:
            # the fastest fifth of the blocks: closest to the machine without other load
            f_num, f_den = _p20(blocks[num]), _p20(blocks[den])
            lines.append(
                f"  {num}/{den} block p20: {f_num / f_den:.4f}; "
                f"{1000 * (f_num - f_den) / block:+.3f} ms/step"
            )
    added = added_per_step(results, args.steps, block)
    lines.append(
        f"added by the trainer (b - a): {added['wall_ms']:+.3f} ms/step (median over rounds of "
        f"the per-round difference, range {added['wall_ms_min']:+.3f} to "
        f"{added['wall_ms_max']:+.3f}); block {added['block_ms']:+.3f} ms/step; "
        f"cpu {added['cpu_ms']:+.3f} ms/step"
    )
    last = {v: results[v][-1].final_loss for v in VARIANTS if results[v]}
    same = "identical" if last.get("a") == last.get("b") == last.get("c") else "DIFFERENT"
    lines.append(
        "final loss: " + "  ".join(f"({v}) {x:.6f}" for v, x in last.items()) + f"  [{same}]"
    )
    for v, counter in reads.items():
        n = sum(counter.counts.values())
        detail = ", ".join(f"{k} {c}" for k, c in sorted(counter.counts.items())) or "none"
        sync = f"; cuda syncs {counter.cuda_syncs}" if device.type == "cuda" else ""
        lines.append(
            f"device reads per step {LABELS[v][:3]}: {n / args.steps:.3f} "
            f"({n} in {args.steps} steps: {detail}{sync})"
        )
    lines.append(summary_line(results, args.steps, block))
    return "\n".join(lines)


def added_per_step(
    results: dict[str, list[RunResult]], steps: int, block: int = 10
) -> dict[str, float]:
    """What (b) adds to a step over (a), in ms: robust statistics of the paired rounds.

    ``wall_ms`` is the median over rounds of ``(b - a) / steps`` (both sides of a round ran
    back to back, so machine-wide drift cancels); ``ratio`` the median of the per-round
    ``b / a``; ``block_ms`` the difference of the block medians per step; ``cpu_ms`` the
    median per-round difference of process CPU time.
    """
    pairs = list(zip(results["a"], results["b"]))
    diffs = [1000 * (b.seconds - a.seconds) / steps for a, b in pairs]
    cpu = [1000 * (b.cpu_seconds - a.cpu_seconds) / steps for a, b in pairs]
    ratios = [b.seconds / a.seconds for a, b in pairs]
    block = max(1, min(block, steps))
    blocks = {v: [x for r in results[v] for x in r.block_seconds(block)] for v in ("a", "b")}
    block_ms = float("nan")
    if blocks["a"] and blocks["b"]:
        block_ms = 1000 * (statistics.median(blocks["b"]) - statistics.median(blocks["a"])) / block
    return {
        "wall_ms": statistics.median(diffs),
        "wall_ms_min": min(diffs),
        "wall_ms_max": max(diffs),
        "ratio": statistics.median(ratios),
        "block_ms": block_ms,
        "cpu_ms": statistics.median(cpu),
    }


def summary_line(results: dict[str, list[RunResult]], steps: int, block: int = 10) -> str:
    """The last line of the output: ``train_step_overhead: added <x> ms/step (b/a <r>)``."""
    added = added_per_step(results, steps, block)
    return f"train_step_overhead: added {added['wall_ms']:.3f} ms/step (b/a {added['ratio']:.4f})"


# ---------------------------------------------------------------------- main
def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print the table and return the measurements."""
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    workdir = tempfile.mkdtemp(prefix="vissl_train_step_overhead_")
    try:
        cfgs = {
            "a": compose(args, os.path.join(workdir, "a"), perf_stats=False),
            "b": compose(args, os.path.join(workdir, "b"), perf_stats=False),
            "c": compose(args, os.path.join(workdir, "c"), perf_stats=True),
        }
        preflight(cfgs["b"], args, device)
        batches = make_batches(cfgs["a"], args, device)

        def run(variant: str, counter: ReadCounter | None = None) -> RunResult:
            if variant == "a":
                return run_hand_loop(cfgs["a"], args, batches, device, counter)
            return run_trainer(cfgs[variant], args, batches, device, counter)

        results: dict[str, list[RunResult]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            # rotate the order so that no variant always runs first (or after another)
            for v in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:
                results[v].append(run(v))

        reads: dict[str, ReadCounter] = {}
        if not args.no_count:
            for v in ("a", "b"):
                counter = ReadCounter()
                with counter.installed():
                    run(v, counter)
                reads[v] = counter

        table = format_table(args, results, reads, device)
        print("\n" + table, flush=True)
        return {
            "results": results,
            "reads": reads,
            "table": table,
            "added": added_per_step(results, args.steps, args.log_frequency),
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main()

"""How long does training wait for data at each phase boundary? (``phase_start_wait``)

When a phase's data ends, vissl starts the next phase's data iterator at once
(``SelfSupervisionTrainer._prefetch_next_phase``): with loader workers, the next phase's
first batches are made while this phase ends (meter sync, checkpoint write, phase-end
hooks). Without it, the workers start only after the phase end, and the first step of the
next phase waits for a whole batch to be decoded and augmented.

This benchmark trains the SimCLR recipe of ``pretrain/simclr/simclr_8gpu_resnet`` (its
2 x 224 augmentation chain, unchanged) on ImageNet-like JPEGs it makes (those of
``benchmarks/data_pipeline.py``), with a very narrow ResNet-18 on the CPU so that the steps
are short, for several epochs, two ways, interleaved round by round:

- **prefetch**: as vissl runs;
- **no prefetch**: ``_prefetch_next_phase`` turned off: the iterator starts with the phase.

Per phase boundary (every phase but the first) it measures

- **wait**: from ``on_phase_start`` to the end of the first ``read_sample`` of the phase
  (the time the first step waits for its batch);
- **boundary**: from the end of the last step of a phase to the end of the first
  ``read_sample`` of the next (the phase end plus the wait: what a boundary costs).

``--phase-end-ms`` adds that much work at each phase end (a hook that sleeps), standing in
for the checkpoint write of a large model or an evaluation (0 by default: the phase end is
then only this tiny model's own checkpoint write, perf-stat log and meter sync).

The last line is ``phase_start_wait: wait <ms> -> <ms> per phase (median)``.

Usage::

    python benchmarks/phase_start_wait.py                       # 2 workers, batch 16
    python benchmarks/phase_start_wait.py --phase-end-ms 500 --workers 4
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks.data_pipeline import make_image_folder
from vissl.hooks import VisslHook, default_hook_generator
from vissl.hooks.base import Priority
from vissl.trainer.train_steps.standard_train_step import StandardTrainStep
from vissl.trainer.trainer_main import SelfSupervisionTrainer

VARIANTS = ("prefetch", "no_prefetch")


class BoundaryClock(VisslHook):
    """Time stamps around phase boundaries (runs last at each event)."""

    priority = Priority.LOWEST + 50

    def __init__(self, phase_end_ms: float) -> None:
        self.phase_end_s = phase_end_ms / 1000.0
        self.last_step_end = 0.0
        self.phase_start = 0.0
        self.first_read_end: float | None = None
        self.waits: list[float] = []
        self.boundaries: list[float] = []

    def on_phase_start(self, task: Any) -> None:
        self.phase_start = time.perf_counter()
        self.first_read_end = None

    def on_step(self, task: Any) -> None:
        self.last_step_end = time.perf_counter()

    def on_phase_end(self, task: Any) -> None:
        if self.phase_end_s > 0:
            time.sleep(self.phase_end_s)

    def first_read(self, task: Any) -> None:
        now = time.perf_counter()
        self.first_read_end = now
        if task.phase_idx > 0:
            self.waits.append(now - self.phase_start)
            self.boundaries.append(now - self.last_step_end)


def run_once(cfg: Any, variant: str, clock: BoundaryClock) -> None:
    from vissl.launch import launch_distributed

    original_read = StandardTrainStep.read_sample
    original_prefetch = SelfSupervisionTrainer._prefetch_next_phase

    def read_sample(self: Any, task: Any) -> Any:
        sample = original_read(self, task)
        if task.local_iteration_num == 0 and clock.first_read_end is None:
            clock.first_read(task)
        return sample

    StandardTrainStep.read_sample = read_sample  # type: ignore[method-assign]
    if variant == "no_prefetch":
        SelfSupervisionTrainer._prefetch_next_phase = lambda self, task: None  # type: ignore[method-assign]
    try:
        launch_distributed(
            cfg,
            node_id=0,
            engine_name="train",
            hook_generator=lambda c: [*default_hook_generator(c), clock],
        )
    finally:
        StandardTrainStep.read_sample = original_read  # type: ignore[method-assign]
        SelfSupervisionTrainer._prefetch_next_phase = original_prefetch  # type: ignore[method-assign]


def compose(args: argparse.Namespace, images: str, out: str) -> Any:
    from vissl.utils.hydra_config import hydra_compose_and_validate

    n = args.batch_size * args.steps
    overrides = [
        "config=pretrain/simclr/simclr_8gpu_resnet",
        f"config.DATA.TRAIN.DATA_PATHS=[{images}]",
        f"config.DATA.TRAIN.DATA_LIMIT={n}",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch_size}",
        f"config.DATA.NUM_DATALOADER_WORKERS={args.workers}",
        "config.DATA.PIN_MEMORY=False",
        "config.MULTI_PROCESSING_METHOD=fork",
        "config.MACHINE.DEVICE=cpu",
        "config.DISTRIBUTED.NUM_NODES=1",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
        "config.MODEL.TRUNK.RESNETS.DEPTH=18",
        "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.0625",
        "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[32,128]}]]",
        "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=False",
        "config.MODEL.AMP_PARAMS.USE_AMP=False",
        "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=False",
        "config.HOOKS.PROGRESS_BAR=False",
        f"config.OPTIMIZER.num_epochs={args.epochs}",
        f"config.CHECKPOINT.DIR={out}",
        "config.CHECKPOINT.CHECKPOINT_FREQUENCY=1",
    ]
    _, cfg = hydra_compose_and_validate(overrides)
    return cfg


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The trainer's stdout (its log lines) to /dev/null for one run."""
    with open(os.devnull, "w", encoding="utf-8") as devnull:
        try:
            with contextlib.redirect_stdout(devnull):
                yield
        finally:  # the run's log handler writes to /dev/null: drop it
            vissl_logger = logging.getLogger("vissl")
            for handler in list(vissl_logger.handlers):
                if getattr(handler, "stream", None) is devnull:
                    vissl_logger.removeHandler(handler)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2, help="loader workers (default 2)")
    p.add_argument("--batch-size", type=int, default=16, help="batch per step (default 16)")
    p.add_argument("--steps", type=int, default=3, help="steps per epoch (default 3)")
    p.add_argument("--epochs", type=int, default=4, help="epochs per run (default 4)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument(
        "--phase-end-ms", type=float, default=0.0, help="extra work at each phase end (ms)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads of the trainer")
    p.add_argument("--quiet", action="store_true", help="hide vissl's log lines")
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers must be >= 1 (without workers nothing can be made ahead)")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.quiet:
        os.environ.setdefault("TQDM_DISABLE", "1")
    tmp = tempfile.mkdtemp(prefix="vissl_phase_wait_")
    results: dict[str, dict[str, list[float]]] = {v: {"wait": [], "boundary": []} for v in VARIANTS}
    try:
        data = os.path.join(tmp, "data")  # a one-class disk_folder: data/images/*.jpg
        make_image_folder(data, args.batch_size * args.steps, seed=0)
        for r in range(args.rounds):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                out = os.path.join(tmp, "runs", f"{variant}_{r}")
                cfg = compose(args, data, out)
                clock = BoundaryClock(args.phase_end_ms)
                with _quiet() if args.quiet else contextlib.nullcontext():
                    run_once(cfg, variant, clock)
                results[variant]["wait"].extend(clock.waits)
                results[variant]["boundary"].extend(clock.boundaries)
                print(
                    f"round {r + 1}/{args.rounds} {variant:12s} wait ms: "
                    + " ".join(f"{1000 * w:.0f}" for w in clock.waits),
                    flush=True,
                )
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    med = {v: {k: 1000 * statistics.median(x) for k, x in results[v].items()} for v in VARIANTS}
    print()
    print(
        f"phase_start_wait: SimCLR 2x224 chain, batch {args.batch_size}, {args.workers} "
        f"workers, {args.steps} steps x {args.epochs} epochs, {args.rounds} rounds, "
        f"extra phase-end work {args.phase_end_ms:.0f} ms"
    )
    print(f"{'variant':14s} {'wait ms (median)':>18s} {'boundary ms (median)':>22s}  boundaries")
    for v in VARIANTS:
        print(
            f"{v:14s} {med[v]['wait']:18.1f} {med[v]['boundary']:22.1f}  {len(results[v]['wait'])}"
        )
    print(
        f"phase_start_wait: wait {med['no_prefetch']['wait']:.0f} -> "
        f"{med['prefetch']['wait']:.0f} ms per phase (median)"
    )
    return {"results": results, "medians": med}


if __name__ == "__main__":
    main()

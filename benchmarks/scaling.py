#!/usr/bin/env python3
"""Data-parallel scaling: images/s of N processes against 1 process, same per-rank batch.

Each measurement is a real vissl training run (launcher, DDP or manual reduction, the
standard train step, hooks) on synthetic images, started through ``launch_distributed``
with every process spawned the same way (one process is spawned too). Steps are timed on
rank 0 after a warm-up; images/s counts the images of all ranks. The process counts are
run interleaved (1, 2, 1, 2, ...) so that a change in machine load hits all of them, and
the table shows medians.

CPU (default): N processes x 1 thread each, gloo::

    python benchmarks/scaling.py --nprocs 1 2 --repeats 5

GPUs: one process per GPU, nccl, started with spawn::

    python benchmarks/scaling.py --device gpu --nprocs 1 2 4 8 --batch-per-rank 64 \
        --image-size 224 --model-width 1

``--start-method`` (``config.MULTI_PROCESSING_METHOD``; default fork on CPU, spawn on
GPUs) picks how the workers start. Under spawn and forkserver each worker re-imports this
file, so everything a worker needs (the timer's settings) travels in the pickled hook
generator (:class:`TimedHooks`), not in module state; CPU CI runs it under spawn::

    python benchmarks/scaling.py --start-method spawn --nprocs 1 2 --repeats 1 --steps 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from vissl.hooks import VisslHook, default_hook_generator  # noqa: E402
from vissl.utils.distributed import get_rank  # noqa: E402
from vissl.utils.distributed_launcher import launch_distributed  # noqa: E402
from vissl.utils.hydra_config import hydra_compose_and_validate  # noqa: E402


class StepTimer(VisslHook):
    """Rank 0 records the time of every training step; writes images/s at the end."""

    def __init__(self, warmup: int, global_batch: int, out: str) -> None:
        self.warmup = warmup
        self.global_batch = global_batch
        self.out = out
        self.times: list[float] = []

    def on_step(self, task: Any) -> None:
        if task.train and get_rank() == 0:
            self.times.append(time.perf_counter())

    def on_end(self, task: Any) -> None:
        if get_rank() != 0:
            return
        timed = self.times[self.warmup :]
        steps = len(timed) - 1
        seconds = timed[-1] - timed[0]
        with open(self.out, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "steps": steps,
                    "seconds": seconds,
                    "images_per_s": steps * self.global_batch / seconds,
                },
                f,
            )


@dataclass(frozen=True)
class TimedHooks:
    """The hook generator handed to ``launch_distributed``: the config's default hooks and
    a :class:`StepTimer` with these settings.

    A module-level class holding its settings, so that it pickles whole to spawned and
    forkserver workers (which re-import this file and would see a module global at its
    default).
    """

    warmup: int
    global_batch: int
    out: str

    def __call__(self, cfg: Any) -> list[Any]:
        return [*default_hook_generator(cfg), StepTimer(self.warmup, self.global_batch, self.out)]


def start_method(args: argparse.Namespace) -> str:
    """``config.MULTI_PROCESSING_METHOD``: ``--start-method``, else fork on CPU (workers
    start at once and use one intra-op thread each, see the launcher) and spawn on GPUs
    (a forked process cannot use CUDA)."""
    if args.start_method:
        return str(args.start_method)
    return "spawn" if args.device == "gpu" else "fork"


def run_once(args: argparse.Namespace, nproc: int, folder: str) -> float:
    steps = args.warmup + args.steps + 1
    global_batch = args.batch_per_rank * nproc
    gpu = args.device == "gpu"
    overrides = [
        "config=test/cpu_test/tiny_supervised",
        "config.TEST_MODEL=False",
        "config.METERS.names=[]",
        "config.LOG_FREQUENCY=1000000",
        "config.DATA.NUM_DATALOADER_WORKERS=0",
        "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
        "config.DATA.TRAIN.LABEL_TYPE=standard",
        f"config.DATA.TRAIN.DATA_LIMIT={global_batch * steps}",
        f"config.DATA.TRAIN.DEFAULT_GRAY_IMG_SIZE={args.image_size}",
        "config.DATA.TRAIN.TRANSFORMS=[{name: ToTensor}]",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch_per_rank}",
        f"config.MODEL.TRUNK.RESNETS.DEPTH={args.depth}",
        f"config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER={args.model_width}",
        f"config.MODEL.HEAD.PARAMS=[[mlp, {{dims: [{_feat_dim(args)}, 10]}}]]",
        "config.OPTIMIZER.num_epochs=1",
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}",
        f"config.DISTRIBUTED.BACKEND={'nccl' if gpu else 'gloo'}",
        f"config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION={args.reduction == 'manual'}",
        f"config.MACHINE.DEVICE={args.device}",
        f"config.MULTI_PROCESSING_METHOD={start_method(args)}",
        "config.CHECKPOINT.AUTO_RESUME=False",
        f"config.CHECKPOINT.DIR={folder}",
    ]
    _, cfg = hydra_compose_and_validate(overrides)
    out = os.path.join(folder, "throughput.json")
    hooks = TimedHooks(warmup=args.warmup, global_batch=global_batch, out=out)
    launch_distributed(cfg, hook_generator=hooks, always_spawn=True)
    with open(out, encoding="utf-8") as f:
        return float(json.load(f)["images_per_s"])


def _independent(args: argparse.Namespace, n: int, folder: str) -> float:
    """``n`` one-process runs at once, no communication: what perfect data parallelism
    could reach on this machine (the hardware's own scaling)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def one(i: int) -> None:
        queue.put(run_once(args, 1, os.path.join(folder, f"p{i}")))

    procs = [ctx.Process(target=one, args=(i,)) for i in range(n)]
    for p in procs:
        p.start()
    rates = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return float(sum(rates))


def _feat_dim(args: argparse.Namespace) -> int:
    return int(64 * args.model_width * (8 if args.depth < 50 else 32))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nprocs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved runs per count")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--batch-per-rank", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--depth", type=int, default=18, choices=[18, 34, 50, 101])
    parser.add_argument("--model-width", type=float, default=0.5)
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--reduction", choices=["ddp", "manual"], default="ddp")
    parser.add_argument(
        "--start-method",
        choices=["fork", "forkserver", "spawn"],
        default=None,
        help="config.MULTI_PROCESSING_METHOD of the workers (default: fork on cpu, spawn on gpu)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results to this JSON file")
    parser.add_argument(
        "--no-independent",
        dest="independent",
        action="store_false",
        help="skip the runs of N independent processes (the machine's own scaling)",
    )
    args = parser.parse_args(argv)

    import torch

    if args.device == "gpu" and max(args.nprocs) > torch.cuda.device_count():
        parser.error(f"{max(args.nprocs)} processes need as many GPUs")
    results: dict[int, list[float]] = {n: [] for n in args.nprocs}
    alone: dict[int, list[float]] = {n: [] for n in args.nprocs}
    with_alone = args.independent and args.device == "cpu"
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vissl_scaling_") as tmp:
        for repeat in range(args.repeats):
            for n in args.nprocs:
                folder = os.path.join(tmp, f"n{n}_r{repeat}")
                value = run_once(args, n, folder)
                results[n].append(value)
                print(
                    f"  run {repeat + 1}/{args.repeats}, {n} process(es): {value:.1f} images/s "
                    f"[{time.perf_counter() - began:.0f} s]",
                    flush=True,
                )
                if with_alone and n > 1:
                    rate = _independent(args, n, folder + "_independent")
                    alone[n].append(rate)
                    print(
                        f"  run {repeat + 1}/{args.repeats}, {n} independent: {rate:.1f} images/s "
                        f"[{time.perf_counter() - began:.0f} s]",
                        flush=True,
                    )

    load_after = os.getloadavg()[0]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = "1 thread" if args.device == "cpu" else "1 GPU"
    smallest = min(args.nprocs)
    per_process = statistics.median(results[smallest]) / smallest  # the 1-process rate
    print()
    print(
        f"vissl scaling: {args.device}, ResNet-{args.depth} x{args.model_width}, "
        f"{args.image_size}px, {args.batch_per_rank} images per rank per step, "
        f"{args.reduction} gradient reduction, {start_method(args)} workers, "
        f"{args.steps} timed steps, "
        f"{args.repeats} interleaved runs; {cores} cores, load average "
        f"{load_before:.1f} before, {load_after:.1f} after"
    )
    header = f"| processes x {threads} | images/s (median) | runs | speed-up | efficiency |"
    if with_alone:
        header += " N independent runs, images/s | DP / independent |"
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for n in args.nprocs:
        med = statistics.median(results[n])
        runs = " ".join(f"{v:.1f}" for v in results[n])
        row = (
            f"| {n} x 1 | {med:.1f} | {runs} | {med / per_process:.2f}x | "
            f"{100 * med / (per_process * n):.0f}% |"
        )
        if with_alone:
            ceiling = statistics.median(alone[n]) if alone[n] else med
            row += f" {ceiling:.1f} | {100 * med / ceiling:.0f}% |"
        print(row)
    if with_alone:
        print(
            "N independent runs: N one-process trainings at once, without communication: "
            "the machine's own scaling (shared cores, memory bandwidth, other load), which "
            "data parallelism cannot beat."
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "device": args.device,
                    "start_method": start_method(args),
                    "images_per_s": {str(n): results[n] for n in args.nprocs},
                    "median_images_per_s": {
                        str(n): statistics.median(results[n]) for n in args.nprocs
                    },
                    "independent_images_per_s": {str(n): alone[n] for n in args.nprocs if alone[n]},
                },
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

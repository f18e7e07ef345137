"""What the ranks' stop agreement costs per step, before and after.

Two gloo processes run a loop of N "steps" (a small matmul standing in for the step's
compute) and, after each, ask whether to stop:

- ``before``: the former check, a blocking all-reduce of a flag and a host read of the
  result after every step;
- ``after``: :class:`vissl.trainer.stopping.StopController` (a non-blocking all-reduce
  started every ``check_every`` steps and read ``check_every`` steps later);
- ``none``: no check (the baseline).

The variants run interleaved, rotating their order each round; the result is the median
added time per step over the baseline, measured in the same run::

    python benchmarks/stop_check.py --steps 2000 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vissl.trainer.stopping import NO_STOP, StopController
from vissl.utils.test_utils import spawn_gloo


class _Task:
    stop_training = False
    stop_training_reason = ""


def _step(a: torch.Tensor) -> None:
    a @ a


def _run(variant: str, steps: int) -> float:
    a = torch.randn(64, 64)
    task = _Task()
    flag = torch.zeros(1, dtype=torch.int32)
    stopper = StopController(check_every=10)
    stopper.install()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        _step(a)
        if variant == "before":
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                break
        elif variant == "after" and stopper.after_step(task) != NO_STOP:
            break
    elapsed = time.perf_counter() - start
    stopper.uninstall()
    dist.barrier()
    return elapsed


def _worker(rank: int, world_size: int, steps: int, rounds: int) -> dict[str, list[float]]:
    variants = ["none", "before", "after"]
    times: dict[str, list[float]] = {v: [] for v in variants}
    _run("none", steps // 10)  # warm-up
    for r in range(rounds):
        order = variants[r % 3 :] + variants[: r % 3]
        for v in order:
            times[v].append(_run(v, steps) / steps)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    results = spawn_gloo(_worker, 2, args.steps, args.rounds)
    times = results[0]  # rank 0's clock; both ranks run in lockstep
    base = statistics.median(times["none"])
    print(f"stop_check: {args.steps} steps x {args.rounds} rounds, 2 gloo processes")
    for v in ("before", "after"):
        added = [t - b for t, b in zip(times[v], times["none"], strict=True)]
        print(
            f"  {v:6s}: {1e6 * statistics.median(times[v]):8.1f} us/step, "
            f"added {1e6 * statistics.median(added):7.1f} us/step over no check "
            f"({1e6 * base:.1f} us/step)"
        )


if __name__ == "__main__":
    main()

"""What does the online kNN monitor cost, and does it agree with the offline tool?
(``online_knn_cost``)

Trains ``quick_start`` (SimCLR on the digits, 30 epochs, CPU) several times, with and
without ``HOOKS.ONLINE_KNN`` (its defaults: the TRAIN digits as the bank, the TEST digits
as queries, k=20, sigma=0.07), interleaved round by round (the order alternates), each run
in this process from the same seed; a run with the monitor trains exactly the same
weights. It reports

- the wall time of each training run (``SelfSupervisionTrainer.train()``: the phases,
  their hooks and checkpoints; not the process start-up), the medians and
  **cost = median(with) / median(without) - 1**, and each round's own ratio (on a shared
  machine these vary by several percent from round to round);
- the monitor's own time (its bank fills and refreshes, query passes and kNN, timed
  inside the hook) as a share of the median run without it: the same cost, measured
  without the run-to-run noise;
- the online top-1 of every phase of the last monitored run, and with ``--offline`` the
  top-1 of ``tools/nearest_neighbor_test.py`` (config
  ``benchmark/nearest_neighbor/digits/nn_digits_quick_start``: the same k, sigma and
  trunk features) on that run's final checkpoint, and their difference.

The last line is::

    online_knn_cost: +<cost>% wall time (median of <n>), monitor <own>% of the run; online top-1 <x>[, offline <y>]

A one-epoch warm-up run comes first (not counted). ``--tiny`` is a smoke mode (a few
seconds: 2 short epochs on 128 digits, a bank of 128 and 64 queries, one round, no
warm-up; ``--offline`` then reads the same subsets).

Usage::

    python benchmarks/online_knn_cost.py --rounds 3 --offline
    python benchmarks/online_knn_cost.py --tiny
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from vissl.hooks import default_hook_generator
from vissl.hooks.online_monitors import OnlineKnnHook
from vissl.trainer.trainer_main import SelfSupervisionTrainer
from vissl.utils.hydra_config import hydra_compose_and_validate

VARIANTS = ("without", "with_knn")
TINY = [
    "config.DATA.TRAIN.DATA_LIMIT=128",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=32",
    "config.DATA.NUM_DATALOADER_WORKERS=0",
    "config.OPTIMIZER.num_epochs=2",
    "config.HOOKS.ONLINE_KNN.BANK.DATA_LIMIT=128",
    "config.HOOKS.ONLINE_KNN.QUERY.DATA_LIMIT=64",
]
#: the offline kNN of --tiny reads the same subsets as the tiny monitor
TINY_OFFLINE = ["config.DATA.TRAIN.DATA_LIMIT=128", "config.DATA.TEST.DATA_LIMIT=64"]
NN_CONFIG = "benchmark/nearest_neighbor/digits/nn_digits_quick_start"


def _config(folder: str, with_knn: bool, extra: Sequence[str]) -> Any:
    _, cfg = hydra_compose_and_validate(
        [
            "config=quick_start",
            f"config.CHECKPOINT.DIR={folder}",
            "config.CHECKPOINT.AUTO_RESUME=false",
            "config.HOOKS.PROGRESS_BAR=false",
            f"config.HOOKS.ONLINE_KNN.USE={str(with_knn).lower()}",
            *extra,
        ]
    )
    return cfg


def train_once(folder: str, with_knn: bool, extra: Sequence[str]) -> dict[str, Any]:
    """One training run in this process: wall time, the monitor's time and values."""
    cfg = _config(folder, with_knn, extra)
    hooks = default_hook_generator(cfg)
    torch.manual_seed(int(cfg.SEED_VALUE))
    trainer = SelfSupervisionTrainer(cfg, folder, torch.device("cpu"), hooks)
    gc.collect()  # the last run's loaders and their workers, before the clock starts
    start = time.perf_counter()
    task = trainer.train()
    wall = time.perf_counter() - start
    knn = [h for h in hooks if isinstance(h, OnlineKnnHook)]
    final = sorted(
        os.path.join(folder, f)
        for f in os.listdir(folder)
        if f.startswith("model_final_checkpoint")
    )
    return {
        "wall_s": wall,
        "monitor_s": knn[0].seconds if knn else 0.0,
        "top_1": [h["top_1"] for h in knn[0].history] if knn else [],
        "iterations": task.iteration,
        "checkpoint": final[-1] if final else None,
    }


def offline_top1(checkpoint: str, folder: str, overrides: Sequence[str] = ()) -> float:
    """``tools/nearest_neighbor_test.py`` on ``checkpoint``: its top-1 (the last line)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tools"))
    import nearest_neighbor_test  # type: ignore[import-not-found]

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = nearest_neighbor_test.main(
            [
                f"config={NN_CONFIG}",
                f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={checkpoint}",
                f"config.CHECKPOINT.DIR={folder}",
                *overrides,
            ]
        )
    if code != 0:
        raise RuntimeError(f"nearest_neighbor_test exited with {code}")
    line = [x for x in out.getvalue().splitlines() if x.startswith("nearest_neighbor:")][-1]
    return float(line.split("top-1 ")[1].split("%")[0])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant")
    parser.add_argument("--epochs", type=int, default=None, help="default: quick_start's 30")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--tiny", action="store_true", help="a few-second smoke run")
    parser.add_argument("--offline", action="store_true", help="also run the offline kNN")
    parser.add_argument("--json", default="", help="write the results to this file")
    parser.add_argument("--quiet", action="store_true", help="no training logs")
    parser.add_argument("overrides", nargs="*", help="more config overrides")
    args = parser.parse_args(list(argv) if argv is not None else None)
    extra = list(TINY) if args.tiny else []
    if args.epochs is not None:
        extra.append(f"config.OPTIMIZER.num_epochs={args.epochs}")
    extra += list(args.overrides)
    rounds = 1 if args.tiny else max(1, args.rounds)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quiet:
        logging.disable(logging.INFO)
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    root = tempfile.mkdtemp(prefix="online_knn_cost_")
    try:
        if not args.tiny:  # imports, allocator and thread pools warm (not counted)
            train_once(
                os.path.join(root, "warmup"), True, [*extra, "config.OPTIMIZER.num_epochs=1"]
            )
        for r in range(rounds):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                folder = os.path.join(root, f"{variant}_{r}")
                run = train_once(folder, variant == "with_knn", extra)
                results[variant].append(run)
                print(
                    f"round {r} {variant:8s} {run['wall_s']:8.2f} s  monitor "
                    f"{run['monitor_s']:6.2f} s",
                    flush=True,
                )
        without = statistics.median(x["wall_s"] for x in results["without"])
        with_knn = statistics.median(x["wall_s"] for x in results["with_knn"])
        own = statistics.median(x["monitor_s"] for x in results["with_knn"])
        last = results["with_knn"][-1]
        paired = [
            100.0 * (a["wall_s"] / b["wall_s"] - 1.0)
            for a, b in zip(results["with_knn"], results["without"], strict=True)
        ]
        summary: dict[str, Any] = {
            "rounds": rounds,
            "median_without_s": without,
            "median_with_s": with_knn,
            "cost_pct": 100.0 * (with_knn / without - 1.0),
            "paired_cost_pct": paired,
            "monitor_pct": 100.0 * own / without,
            "online_top_1": last["top_1"],
        }
        gc.collect()  # the runs' loader iterators, before the offline tool forks
        if args.offline and last["checkpoint"]:
            with contextlib.ExitStack() as stack:
                if args.quiet:
                    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
                summary["offline_top_1"] = offline_top1(
                    last["checkpoint"], os.path.join(root, "nn"), TINY_OFFLINE if args.tiny else ()
                )
            summary["difference_pt"] = last["top_1"][-1] - summary["offline_top_1"]
    finally:
        if args.quiet:
            logging.disable(logging.NOTSET)
        shutil.rmtree(root, ignore_errors=True)
    print("cost of each round (with / without - 1): " + ", ".join(f"{p:+.1f}%" for p in paired))
    print("online top-1 per phase: " + ", ".join(f"{v:.2f}" for v in summary["online_top_1"]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"summary": summary, "results": results}, f, indent=2)
    tail = f", offline {summary['offline_top_1']:.2f}" if "offline_top_1" in summary else ""
    print(
        f"online_knn_cost: {summary['cost_pct']:+.1f}% wall time (median of {rounds}), "
        f"monitor {summary['monitor_pct']:.1f}% of the run; online top-1 "
        f"{summary['online_top_1'][-1]:.2f}{tail}",
        flush=True,
    )
    return {"summary": summary, "results": results}


if __name__ == "__main__":
    main()

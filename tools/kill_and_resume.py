#!/usr/bin/env python3
"""Kill training at random moments with SIGKILL, auto-resume, and compare final weights.

    python tools/kill_and_resume.py --trials 20
    python tools/kill_and_resume.py --trials 5 --nproc 2 --workers 2 --iter-freq 3

1. Runs the config to completion once (the reference).
2. For each trial, starts the same run in a fresh folder and SIGKILLs its whole process
   group at random moments (1 to ``--max-kills`` times; every third trial also waits for a
   checkpoint write in progress and kills during it), restarting it each time with
   ``AUTO_RESUME`` until it finishes on its own.
3. Compares each trial's final weights with the reference, bitwise.

Prints one line per trial and ``trials passed: P/N``; exits non-zero if any trial failed.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vissl.utils.checkpoint import load_checkpoint  # noqa: E402

TOOL = REPO / "tools" / "run_distributed_engines.py"


def overrides(args: argparse.Namespace, folder: Path) -> list[str]:
    return [
        f"config={args.config}",
        f"config.DATA.TRAIN.DATA_LIMIT={args.data_limit}",
        f"config.OPTIMIZER.num_epochs={args.epochs}",
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={args.nproc}",
        f"config.DATA.NUM_DATALOADER_WORKERS={args.workers}",
        f"config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY={args.iter_freq}",
        f"config.CHECKPOINT.CHECKPOINT_FREQUENCY={args.phase_freq}",
        "config.CHECKPOINT.AUTO_RESUME=True",
        "config.CHECKPOINT.OVERWRITE_EXISTING=False",
        "config.MULTI_PROCESSING_METHOD=fork",
        "config.HOOKS.PROGRESS_BAR=False",
        f"config.CHECKPOINT.DIR={folder}",
        *args.extra,
    ]


def start(args: argparse.Namespace, folder: Path) -> subprocess.Popen[bytes]:
    log = open(folder.parent / f"{folder.name}.out", "ab")
    return subprocess.Popen(
        [sys.executable, str(TOOL), *overrides(args, folder)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: SIGKILL reaches every worker
    )


def kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def final_weights(folder: Path) -> dict[str, object]:
    """The final model weights, and the loss's state (queues, momentum encoders) and every
    rank's own loss state, keyed ``trunk.*``, ``heads.*``, ``loss.*``, ``rank<r>.loss.*``."""
    paths = sorted(folder.glob("model_final_checkpoint_phase*.torch"))
    if not paths:
        raise RuntimeError(f"no final checkpoint in {folder}")
    classy = load_checkpoint(str(paths[-1]))["classy_state_dict"]
    model = classy["base_model"]["model"]
    state = {f"trunk.{k}": v for k, v in model["trunk"].items()} | {
        f"heads.{k}": v for k, v in model["heads"].items()
    }
    state |= _flatten(classy.get("loss", {}), "loss")
    for rank, mine in enumerate(classy.get("per_rank") or []):
        state |= _flatten(mine.get("loss") or {}, f"rank{rank}.loss")
    return state


def _flatten(obj: object, prefix: str) -> dict[str, object]:
    """Nested dicts/lists as ``{"prefix.key.0": leaf}``."""
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, list | tuple):
        items = list(enumerate(obj))
    else:
        return {prefix: obj}
    out: dict[str, object] = {}
    for key, value in items:
        out |= _flatten(value, f"{prefix}.{key}")
    return out


def wait_for_write(folder: Path, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Poll until a checkpoint write is in progress (a temporary file exists)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if folder.exists() and any(p.name.startswith(".tmp_") for p in folder.iterdir()):
            return True
        time.sleep(0.002)
    return False


def run_trial(
    args: argparse.Namespace, rng: random.Random, folder: Path, duration: float, index: int
) -> tuple[bool, str]:
    import torch

    folder.mkdir(parents=True)
    kills: list[str] = []
    n_kills = rng.randint(1, args.max_kills)
    for k in range(n_kills + 20):
        proc = start(args, folder)
        if k < n_kills:
            if index % 3 == 2 and k == 0:
                hit = wait_for_write(folder, proc, duration * 2)
                if hit:
                    kill(proc)
                    kills.append("during-write")
                    continue
            delay = rng.uniform(0.5, 0.9 * duration)
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                kill(proc)
                kills.append(f"{delay:.1f}s")
                continue
        if proc.wait(timeout=args.timeout) == 0:
            break
        return False, f"run exited with code {proc.returncode} (see {folder}.out)"
    reference = final_weights(folder.parent / "reference")
    result = final_weights(folder)
    different = sorted(reference.keys() ^ result.keys()) + [
        k
        for k in reference.keys() & result.keys()
        if not (
            torch.equal(reference[k], result[k])  # type: ignore[arg-type]
            if isinstance(reference[k], torch.Tensor)
            else reference[k] == result[k]
        )
    ]
    detail = f"kills at {kills or ['none (finished first)']}"
    if different:
        return False, f"{detail}; {len(different)} tensors differ, e.g. {different[:2]}"
    return True, detail


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default="test/cpu_test/tiny_simclr")
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument(
        "--iter-freq", type=int, default=2, help="CHECKPOINT_ITER_FREQUENCY (-1: phase only)"
    )
    parser.add_argument("--phase-freq", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--data-limit", type=int, default=32)
    parser.add_argument("--max-kills", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("extra", nargs="*", help="more config overrides")
    args = parser.parse_args()

    root = Path(args.workdir or tempfile.mkdtemp(prefix="vissl_kill_"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"work folder: {root}", flush=True)
    t0 = time.monotonic()
    ref = start(args, root / "reference")
    if ref.wait(timeout=args.timeout) != 0:
        print(f"reference run failed; see {root}/reference.out")
        return 2
    duration = time.monotonic() - t0
    print(f"reference run: {duration:.1f}s", flush=True)

    rng = random.Random(args.seed)
    passed = 0
    for i in range(args.trials):
        ok, detail = run_trial(args, rng, root / f"trial{i:02d}", duration, i)
        passed += ok
        print(f"trial {i + 1:2d}/{args.trials}: {'PASS' if ok else 'FAIL'}  {detail}", flush=True)
    print(f"trials passed: {passed}/{args.trials}")
    return 0 if passed == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())

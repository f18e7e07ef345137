"""Golden traces of the quick configs: record them before a refactor, check them after.

For every quick config (``configs/config/quick_start.yaml`` and
``configs/config/test/integration_test/quick_*.yaml``) a run on the CPU, in fp32, in one
process with one thread, at the config's seed, logs its loss at every iteration; the trace
is the first 20 logged losses (as the floats the trainer logged) and the SHA-256 of the
final checkpoint's tensors (the model's trunk and heads, and the loss state: teachers,
centers, queues), each part hashed separately so a difference says where it is.

Record (before the change), keeping the first phase's checkpoint of each run for the
resume check::

    python extra_scripts/golden_traces.py record --out tests/golden/quick_traces.json \\
        --checkpoints /tmp/golden_ckpts

Check (after the change): the traces equal, bit for bit; with ``--resume-from``, each run
also resumes from the checkpoint the old code wrote after its first phase and must end
with the recorded checksums (old checkpoints load and resume bitwise)::

    python extra_scripts/golden_traces.py check --golden tests/golden/quick_traces.json \\
        --resume-from /tmp/golden_ckpts [--only quick_dino quick_ibot]

``quick_start`` runs 2 of its 30 epochs here (``config.OPTIMIZER.num_epochs=2``) to keep
the record under a few minutes; every other config runs as it is.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from extra_scripts._common import HelpFormatter, ScriptError, run_script  # noqa: E402

#: Losses kept per config.
NUM_LOSSES = 20
#: Overrides for every run: log every iteration, no TensorBoard, no progress bar.
COMMON = [
    "config.LOG_FREQUENCY=1",
    "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=False",
    "config.HOOKS.PROGRESS_BAR=False",
    "config.MACHINE.DEVICE=cpu",
    "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
]
#: Per-config overrides (to keep the record short).
#: (the one-phase SwAV runs keep an iteration checkpoint, quick_start one per phase, so that
#: each has a checkpoint before its final one to resume from; writing a checkpoint changes
#: nothing of the training).
_SWAV_ITER = ["config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"]
EXTRA = {
    "quick_start": ["config.OPTIMIZER.num_epochs=2", "config.CHECKPOINT.CHECKPOINT_FREQUENCY=1"],
    "quick_swav": _SWAV_ITER,
    "quick_swav_momentum": _SWAV_ITER,
    "quick_swav_multicrop": _SWAV_ITER,
    "quick_swav_queue": _SWAV_ITER,
}


def quick_configs() -> dict[str, str]:
    """Short name -> Hydra config name, for every quick config in the tree."""
    names = {"quick_start": "quick_start"}
    pattern = os.path.join(REPO, "configs/config/test/integration_test/quick_*.yaml")
    for path in sorted(glob.glob(pattern)):
        short = os.path.basename(path)[: -len(".yaml")]
        names[short] = f"test/integration_test/{short}"
    return names


def _tensor_digest(state: dict[str, Any], prefix: str = "") -> dict[str, bytes]:
    import torch

    out: dict[str, bytes] = {}
    for key in sorted(state):
        value = state[key]
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= _tensor_digest(value, f"{name}.")
        elif isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            header = f"{name}|{t.dtype}|{tuple(t.shape)}|".encode()
            out[name] = header + t.view(-1).view(torch.uint8).numpy().tobytes()
    return out


def checkpoint_checksums(path: str) -> dict[str, str]:
    """SHA-256 of the model's and of the loss's tensors in a final checkpoint."""
    from vissl.utils.checkpoint import load_checkpoint

    classy = load_checkpoint(path)["classy_state_dict"]
    parts = {"model": classy["base_model"]["model"], "loss": classy.get("loss", {}) or {}}
    sums: dict[str, str] = {}
    for part, state in parts.items():
        digest = hashlib.sha256()
        for blob in _tensor_digest(state).values():
            digest.update(blob)
        sums[part] = digest.hexdigest()
    return sums


def _run(config: str, folder: str, extra: Sequence[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=REPO)
    cmd = [
        sys.executable,
        os.path.join(REPO, "tools/run_distributed_engines.py"),
        f"config={config}",
        f"config.CHECKPOINT.DIR={folder}",
        *COMMON,
        *extra,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO, check=False)


def _trace(short: str, folder: str, proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    if proc.returncode != 0:
        raise ScriptError(f"{short} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    with open(os.path.join(folder, "stdout.json"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    losses = [r["loss"] for r in rows if r.get("train", True) and "loss" in r]
    (final,) = glob.glob(os.path.join(folder, "model_final_checkpoint_phase*.torch"))
    return {
        "losses": losses[:NUM_LOSSES],
        "iterations": len(losses),
        "checksums": checkpoint_checksums(final),
    }


def record_one(short: str, config: str, keep: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"golden_{short}_") as folder:
        trace = _trace(short, folder, _run(config, folder, EXTRA.get(short, [])))
        first = _first_checkpoint(folder)
        if keep is not None and first is not None:
            os.makedirs(os.path.join(keep, short), exist_ok=True)
            shutil.copy2(first, os.path.join(keep, short, os.path.basename(first)))
        return trace


def _first_checkpoint(folder: str) -> str | None:
    """The run's first checkpoint before its final one (phase 0, else the first iteration)."""
    phase0 = os.path.join(folder, "model_phase0.torch")
    if os.path.exists(phase0):
        return phase0
    iterations = glob.glob(os.path.join(folder, "model_iteration*.torch"))
    number = lambda p: int(os.path.basename(p)[len("model_iteration") : -len(".torch")])  # noqa: E731
    return min(iterations, key=number) if iterations else None


def resume_one(short: str, config: str, source: str) -> dict[str, Any] | None:
    kept = glob.glob(os.path.join(source, short, "model_*.torch"))
    if not kept:
        return None
    (first,) = kept
    with tempfile.TemporaryDirectory(prefix=f"golden_resume_{short}_") as folder:
        shutil.copy2(first, os.path.join(folder, os.path.basename(first)))
        overrides = [*EXTRA.get(short, []), "config.CHECKPOINT.AUTO_RESUME=True"]
        proc = _run(config, folder, overrides)
        if proc.returncode != 0:
            raise ScriptError(f"{short} resume failed: {proc.stderr[-2000:]}")
        with open(os.path.join(folder, "log.txt"), encoding="utf-8") as f:
            if "resuming from" not in f.read():
                raise ScriptError(f"{short}: the run did not resume from {first}")
        (final,) = glob.glob(os.path.join(folder, "model_final_checkpoint_phase*.torch"))
        return {"checksums": checkpoint_checksums(final)}


def _selected(only: Sequence[str] | None) -> dict[str, str]:
    configs = quick_configs()
    if not only:
        return configs
    unknown = sorted(set(only) - configs.keys())
    if unknown:
        raise ScriptError(f"unknown quick configs {unknown}; known: {sorted(configs)}")
    return {k: configs[k] for k in only}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run every quick config and write the traces")
    rec.add_argument("--out", required=True, help="the JSON file to write")
    rec.add_argument("--checkpoints", help="keep each run's first-phase checkpoint here")
    chk = sub.add_parser("check", help="run the quick configs and compare with the traces")
    chk.add_argument("--golden", required=True, help="the JSON file written by record")
    chk.add_argument("--resume-from", help="also resume from the checkpoints kept by record")
    for p in (rec, chk):
        p.add_argument("--only", nargs="*", help="short names (quick_dino ...); default all")
        p.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    args = parser.parse_args(argv)
    configs = _selected(args.only)

    if args.command == "record":
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = {
                k: pool.submit(record_one, k, c, args.checkpoints) for k, c in configs.items()
            }
            traces = {k: f.result() for k, f in futures.items()}
        import torch

        if args.only and os.path.exists(args.out):  # update those configs only
            with open(args.out, encoding="utf-8") as f:
                traces = json.load(f)["configs"] | traces
        payload = {"torch": torch.__version__, "num_losses": NUM_LOSSES, "configs": traces}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"recorded {len(traces)} configs into {args.out}")
        return 0

    with open(args.golden, encoding="utf-8") as f:
        golden = json.load(f)["configs"]
    missing = sorted(set(configs) - golden.keys())
    if missing:
        raise ScriptError(f"no golden trace for {missing}: record them first")
    failures: list[str] = []

    def check_one(short: str) -> str:
        with tempfile.TemporaryDirectory(prefix=f"golden_check_{short}_") as folder:
            now = _trace(short, folder, _run(configs[short], folder, EXTRA.get(short, [])))
        then = golden[short]
        problems = []
        if now["losses"] != then["losses"]:
            first = next(
                (i for i, (a, b) in enumerate(zip(now["losses"], then["losses"])) if a != b),
                min(len(now["losses"]), len(then["losses"])),
            )
            problems.append(f"losses differ from iteration {first + 1}")
        for part, digest in then["checksums"].items():
            if now["checksums"].get(part) != digest:
                problems.append(f"final {part} checksum differs")
        if args.resume_from:
            resumed = resume_one(short, configs[short], args.resume_from)
            if resumed is None:
                problems.append("(no old checkpoint to resume from)")
            else:
                for part, digest in then["checksums"].items():
                    if resumed["checksums"].get(part) != digest:
                        problems.append(f"resumed from the old checkpoint: final {part} differs")
        hard = [p for p in problems if not p.startswith("(")]
        if hard:
            failures.append(short)
        return f"{'FAIL' if hard else 'ok  '} {short}: " + ("; ".join(problems) or "equal")

    with ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(check_one, configs):
            print(line, flush=True)
    print(f"{len(configs) - len(failures)}/{len(configs)} equal")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run_script(main, None))

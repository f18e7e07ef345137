#!/usr/bin/env python3
"""kNN error against training time: every checkpoint of a digits pretraining run, probed.

    python extra_scripts/digits_knn_curve.py RUN_DIR --probe PROBE_CONFIG [--random] \\
        [--out DIR] [-- OVERRIDE ...]

``RUN_DIR`` is the ``CHECKPOINT.DIR`` of a finished pretraining run (its
``model_phase<N>.torch`` and ``model_final_checkpoint_phase<N>.torch`` files, and the
``log.txt`` the run wrote there). Each checkpoint goes through
``tools/nearest_neighbor_test.py config=<PROBE_CONFIG>`` (one process each, the same probe
a user runs by hand), its features under ``<out>/phase<N>``; ``--random`` probes the
random-init trunk too (0 epochs). The overrides after ``--`` go to every probe (for
example the state-dict key of an EMA target encoder). The training minutes of a
checkpoint are the summed ``phase <i> (train) done in <s>s`` times of the phases up to
it in ``log.txt`` (wall time of the training phases, without start-up and checkpoint
writing). Output: one markdown table, ``| epochs | training minutes | kNN error |``; the
epochs are the phase number + 1, so the run must have no test phases (``TEST_MODEL:
False``, as the digits pretraining configs).

examples:
  python tools/run_distributed_engines.py config=digits/ijepa \\
      config.CHECKPOINT.CHECKPOINT_FREQUENCY=1
  python extra_scripts/digits_knn_curve.py checkpoints/digits_ijepa --random \\
      --probe benchmark/nearest_neighbor/digits/nn_digits_ijepa

Exit codes: 0 printed, 2 a missing run folder, no checkpoint in it, or a probe that failed
(one line on stderr).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Sequence

from _common import HelpFormatter, ScriptError, run_script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKPOINT = re.compile(r"^model_(?:final_checkpoint_)?phase(\d+)\.torch$")
#: ``phase 3/30 (train) done in 12.5s`` (1-based; logs before vissl 0.2 wrote the
#: 0-based ``phase 2 (train) done in 12.5s``)
PHASE_DONE = re.compile(r"phase (\d+)(/\d+)? \(train\) done in ([0-9.]+)s")
PROBE_LINE = re.compile(r"^nearest_neighbor: top-1 [0-9.]+% \(error ([0-9.]+)%\)")


def checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """``(phase, path)`` of the run's phase checkpoints, by phase (a final checkpoint wins
    over a phase checkpoint of the same phase).

    Raises:
        ScriptError: ``run_dir`` is not a folder or holds no checkpoint.
    """
    if not os.path.isdir(run_dir):
        raise ScriptError(f"{run_dir} is not a folder (give a run's CHECKPOINT.DIR).")
    found: dict[int, str] = {}
    for name in sorted(os.listdir(run_dir)):
        m = CHECKPOINT.match(name)
        if m and (int(m.group(1)) not in found or "final" in name):
            found[int(m.group(1))] = os.path.join(run_dir, name)
    if not found:
        raise ScriptError(
            f"{run_dir} holds no model_phase<N>.torch: pretrain with "
            "config.CHECKPOINT.CHECKPOINT_FREQUENCY=1 for a checkpoint per epoch."
        )
    return sorted(found.items())


def phase_seconds(log_text: str) -> dict[int, float]:
    """Each training phase's time in seconds, from the lines of a run's ``log.txt`` (the
    last line of a phase wins: a resumed run logs a phase again)."""
    return {int(p) - (1 if total else 0): float(s) for p, total, s in PHASE_DONE.findall(log_text)}


def minutes_until(seconds: dict[int, float], phase: int) -> float | None:
    """The training minutes up to the end of ``phase``; None where a phase is missing."""
    if any(p not in seconds for p in range(phase + 1)):
        return None
    return sum(seconds[p] for p in range(phase + 1)) / 60.0


def probe(probe_config: str, params_file: str, out: str, overrides: Sequence[str]) -> float:
    """The kNN error (%) of ``tools/nearest_neighbor_test.py`` on ``params_file`` ("" for
    the random init).

    Raises:
        ScriptError: the probe failed or printed no result line.
    """
    cmd = [
        sys.executable,
        os.path.join(REPO, "tools", "nearest_neighbor_test.py"),
        f"config={probe_config}",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={params_file}",
        f"config.CHECKPOINT.DIR={out}",
        *overrides,
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    m = PROBE_LINE.match(lines[-1]) if lines else None
    if proc.returncode != 0 or m is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ScriptError(f"the probe of {params_file or 'the random init'} failed: {tail[0]}")
    return float(m.group(1))


def table(rows: Sequence[tuple[int, float | None, float]]) -> str:
    """The markdown table of ``(epochs, minutes or None, error)`` rows."""
    out = ["| epochs | training minutes | kNN error |", "|---|---|---|"]
    for epochs, minutes, error in rows:
        shown = "?" if minutes is None else f"{minutes:.1f}"
        out.append(f"| {epochs} | {shown} | {error:.2f}% |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=HelpFormatter,
        usage="%(prog)s RUN_DIR --probe PROBE_CONFIG [--random] [--out DIR] [-- OVERRIDE ...]",
    )
    parser.add_argument("run_dir", help="the pretraining run's CHECKPOINT.DIR")
    parser.add_argument("--probe", required=True, help="the kNN probe config (config=...)")
    parser.add_argument("--random", action="store_true", help="probe the random init too")
    parser.add_argument("--out", default=None, help="feature folders (default RUN_DIR/knn_curve)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    overrides = argv[cut + 1 :]
    found = checkpoints(args.run_dir)
    log = os.path.join(args.run_dir, "log.txt")
    seconds: dict[int, float] = {}
    if os.path.isfile(log):
        with open(log, encoding="utf-8") as f:
            seconds = phase_seconds(f.read())
    out = args.out or os.path.join(args.run_dir, "knn_curve")
    rows: list[tuple[int, float | None, float]] = []
    if args.random:
        rows.append((0, 0.0, probe(args.probe, "", os.path.join(out, "random"), overrides)))
    for phase, path in found:
        error = probe(args.probe, path, os.path.join(out, f"phase{phase}"), overrides)
        rows.append((phase + 1, minutes_until(seconds, phase), error))
        print(f"epoch {phase + 1}: {error:.2f}%", file=sys.stderr, flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

#!/usr/bin/env python3
"""kNN error against training time: every checkpoint of a pretraining run, probed.

    python extra_scripts/digits_knn_curve.py RUN_DIR --probe PROBE_CONFIG [--random] \\
        [--out DIR] [--save TABLE.md] [--plot PNG --label NAME] [-- OVERRIDE ...]
    python extra_scripts/digits_knn_curve.py --plot PNG --tables NAME=TABLE.md ...

Any data source: the probe config names it (``digits``: the
``benchmark/nearest_neighbor/digits/`` probes; ``mnist5k``: the
``benchmark/nearest_neighbor/mnist5k/`` ones). The name stays ``digits_knn_curve.py``,
where it began.

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
False``, as the digits and mnist5k pretraining configs). ``--save`` writes the table to a
file too; ``--plot`` draws the curve (kNN error against training minutes) into a PNG
(needs matplotlib), and ``--plot PNG --tables NAME=TABLE.md ...`` draws several saved
tables into one figure without probing anything (rows whose minutes are unknown are left
out of a plot).

examples:
  python tools/run_distributed_engines.py config=digits/ijepa \\
      config.CHECKPOINT.CHECKPOINT_FREQUENCY=1
  python extra_scripts/digits_knn_curve.py checkpoints/digits_ijepa --random \\
      --probe benchmark/nearest_neighbor/digits/nn_digits_ijepa
  python extra_scripts/digits_knn_curve.py checkpoints/mnist5k_dino_vit \\
      --probe benchmark/nearest_neighbor/mnist5k/nn_mnist5k_vit --save dino_vit.md \\
      -- +config/benchmark/nearest_neighbor/mnist5k/encoder=teacher
  python extra_scripts/digits_knn_curve.py --plot curve.png \\
      --tables dino_vit=dino_vit.md mae=mae.md

Exit codes: 0 printed, 2 a missing run folder, no checkpoint in it, a probe that failed,
an unreadable table or no matplotlib for ``--plot`` (one line on stderr).
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


TABLE_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*([0-9.]+|\?)\s*\|\s*([0-9.]+)%\s*\|$")


def parse_table(text: str) -> list[tuple[int, float | None, float]]:
    """The ``(epochs, minutes or None, error)`` rows of a table written by :func:`table`.

    Raises:
        ScriptError: the text holds no such row.
    """
    rows: list[tuple[int, float | None, float]] = []
    for line in text.splitlines():
        m = TABLE_ROW.match(line.strip())
        if m:
            minutes = None if m.group(2) == "?" else float(m.group(2))
            rows.append((int(m.group(1)), minutes, float(m.group(3))))
    if not rows:
        raise ScriptError("no '| epochs | training minutes | kNN error |' row in the table.")
    return rows


def plot(
    curves: Sequence[tuple[str, Sequence[tuple[int, float | None, float]]]], path: str
) -> None:
    """Draw each ``(label, rows)`` curve, kNN error against training minutes, into ``path``
    (a PNG); rows with unknown minutes are left out.

    Raises:
        ScriptError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ScriptError(
            "--plot needs matplotlib (pip install matplotlib); the table is printed without it."
        ) from err
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, rows in curves:
        points = [(m, e) for _, m, e in rows if m is not None]
        ax.plot([m for m, _ in points], [e for _, e in points], marker="o", label=label)
    ax.set_xlabel("pretraining minutes")
    ax.set_ylabel("kNN error (%)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def read_tables(specs: Sequence[str]) -> list[tuple[str, list[tuple[int, float | None, float]]]]:
    """``NAME=TABLE.md`` arguments as ``(NAME, rows)``.

    Raises:
        ScriptError: an argument without ``=``, a missing file or a file without rows.
    """
    curves = []
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise ScriptError(f"--tables takes NAME=TABLE.md arguments, not {spec!r}.")
        if not os.path.isfile(path):
            raise ScriptError(f"--tables: {path} is not a file (write it with --save).")
        with open(path, encoding="utf-8") as f:
            try:
                curves.append((label, parse_table(f.read())))
            except ScriptError as err:
                raise ScriptError(f"--tables: {path}: {err}") from None
    return curves


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=HelpFormatter,
        usage="%(prog)s RUN_DIR --probe PROBE_CONFIG [--random] [--out DIR] [--save TABLE.md] "
        "[--plot PNG --label NAME] [-- OVERRIDE ...] | %(prog)s --plot PNG --tables NAME=TABLE.md ...",
    )
    parser.add_argument("run_dir", nargs="?", help="the pretraining run's CHECKPOINT.DIR")
    parser.add_argument("--probe", help="the kNN probe config (config=...)")
    parser.add_argument("--random", action="store_true", help="probe the random init too")
    parser.add_argument("--out", default=None, help="feature folders (default RUN_DIR/knn_curve)")
    parser.add_argument("--save", default=None, help="write the table to this file too")
    parser.add_argument("--plot", default=None, help="draw the curve(s) into this PNG")
    parser.add_argument("--label", default=None, help="the curve's name in --plot (RUN_DIR's)")
    parser.add_argument(
        "--tables", nargs="+", default=None, help="NAME=TABLE.md: plot saved tables, probe nothing"
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    overrides = argv[cut + 1 :]
    if args.tables is not None:
        if args.plot is None or args.run_dir is not None:
            parser.error("--tables draws saved tables: give --plot PNG and no RUN_DIR")
        plot(read_tables(args.tables), args.plot)
        return 0
    if args.run_dir is None or args.probe is None:
        parser.error("RUN_DIR and --probe are required (or --plot PNG --tables ...)")
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
    text = table(rows)
    print(text)
    if args.save:
        with open(args.save, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if args.plot:
        label = args.label or os.path.basename(os.path.normpath(args.run_dir))
        plot([(label, rows)], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

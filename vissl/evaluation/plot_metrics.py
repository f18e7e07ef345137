"""Plot the training curves of one or several runs into one PNG.

Reads what a run writes into its ``CHECKPOINT.DIR``: ``stdout.json`` (one line every
``LOG_FREQUENCY`` train iterations: loss and learning rate) and ``metrics.json`` (one line
per train or test phase: the phase's mean loss and every meter). Draws, one panel each:

- loss vs iteration (``stdout.json``);
- learning rate vs iteration (``stdout.json``);
- the phase mean loss vs epoch, train and test (``metrics.json``);
- every meter value vs epoch, train and test (``metrics.json``; names flattened as the
  early-stopping and summary hooks name them, e.g. ``accuracy_list_meter_top_1``).

Several run folders are overlaid, one colour per run, with a legend of run names (the
folder names, or ``--labels``); train is drawn solid, test dashed. A resumed or restarted
run's logs are read as the run went: records that a resume repeated replace the old ones.

Needs matplotlib (``pip install -e ".[plots]"``); the Agg backend is used, so no display
is needed.

examples:
  python tools/plot_metrics.py checkpoints/quick_start --out quick_start_curves.png
  python tools/plot_metrics.py runs/simclr runs/moco --labels SimCLR MoCo --out compare.png
  python tools/plot_metrics.py checkpoints/linear_digits_quick_start --metrics top_1

Exit codes: 0 written, 2 a bad input or no matplotlib (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vissl.hooks.metrics import flatten_metrics
from vissl.utils.cli import HelpFormatter

PROG = "tools/plot_metrics.py"
MISSING_MATPLOTLIB = f'{PROG} needs matplotlib: pip install -e ".[plots]"'
STDOUT_JSON = "stdout.json"
METRICS_JSON = "metrics.json"
SPLITS = ("train", "test")


class PlotError(Exception):
    """A user mistake: printed as one ``error: ...`` line, exit code 2."""


@dataclass
class RunLogs:
    """The curves of one run folder."""

    label: str
    #: stdout.json, by iteration: (iteration, loss, lr)
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    #: metrics.json, per split: name -> [(epoch, value)]; name "loss" is the phase loss
    phases: dict[str, dict[str, list[tuple[int, float]]]] = field(
        default_factory=lambda: {s: {} for s in SPLITS}
    )


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one per line.

    Raises:
        PlotError: the file is empty, or a line is empty, not JSON, or not an object with
            an ``iteration``.
    """
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise PlotError(f"{path} cannot be read: {err}") from err
    if not lines:
        raise PlotError(f"{path} is empty: the run has logged nothing yet.")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise PlotError(f"{path} line {number} is empty; each line must be one JSON record.")
        try:
            record = json.loads(line)
        except ValueError as err:
            raise PlotError(
                f"{path} line {number} is not valid JSON ({err.args[0] if err.args else err}): "
                f"{line[:80]!r}. A run killed while writing leaves a cut line; delete it."
            ) from err
        if not isinstance(record, dict) or not isinstance(record.get("iteration"), int):
            raise PlotError(
                f"{path} line {number} is not a vissl log record (a JSON object with an "
                f"integer 'iteration'): {line[:80]!r}."
            )
        records.append(record)
    return records


def _as_run(records: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The records of the run as it went: a record whose ``key`` does not grow starts
    again from there (a resume or a restart), dropping the records it repeats."""
    kept: list[dict[str, Any]] = []
    for record in records:
        position = record.get(key, record["iteration"])
        while kept and kept[-1].get(key, kept[-1]["iteration"]) >= position:
            kept.pop()
        kept.append(record)
    return kept


def _number(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return math.nan


def read_run(folder: str, label: str) -> RunLogs:
    """Read ``stdout.json`` and ``metrics.json`` of a run folder.

    Raises:
        PlotError: ``folder`` is not a folder, holds neither file, or a file is corrupt.
    """
    if not os.path.isdir(folder):
        raise PlotError(f"{folder} is not a folder; give the CHECKPOINT.DIR of a run.")
    stdout_path = os.path.join(folder, STDOUT_JSON)
    metrics_path = os.path.join(folder, METRICS_JSON)
    if not os.path.isfile(stdout_path) and not os.path.isfile(metrics_path):
        raise PlotError(
            f"{folder} has neither {STDOUT_JSON} nor {METRICS_JSON}: give the "
            "CHECKPOINT.DIR of a run that has logged at least one iteration."
        )
    run = RunLogs(label)
    if os.path.isfile(stdout_path):
        # the phase-end records of the online monitors repeat the last step's iteration
        steps = [r for r in read_jsonl(stdout_path) if not r.get("phase_end")]
        for record in _as_run(steps, "iteration"):
            if record.get("train", True) is False:
                continue
            run.steps.append(
                (record["iteration"], _number(record.get("loss")), _number(record.get("lr")))
            )
    if os.path.isfile(metrics_path):
        for record in _as_run(read_jsonl(metrics_path), "phase_idx"):
            epoch = int(record.get("train_phase_idx", 0)) + 1
            for name, value in flatten_metrics(record).items():
                split, _, rest = name.partition("_")
                if split in SPLITS and rest:
                    run.phases[split].setdefault(rest, []).append((epoch, value))
    return run


def _labels(folders: Sequence[str], labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != len(folders):
            raise PlotError(
                f"--labels has {len(labels)} names for {len(folders)} run folders; give one each."
            )
        return list(labels)
    names = [os.path.basename(os.path.normpath(f)) or f for f in folders]
    if len(set(names)) != len(names):  # the same folder name in several places
        return [os.path.normpath(f) for f in folders]
    return names


def _pyplot() -> Any:
    """matplotlib.pyplot with the Agg backend, or the one-line error when it is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise PlotError(MISSING_MATPLOTLIB) from err
    return plt


def panels(runs: Sequence[RunLogs], metric_filters: Sequence[str]) -> list[str]:
    """The panel names, in drawing order: ``loss``, ``lr``, ``phase loss``, the meters."""
    out = []
    if any(r.steps for r in runs):
        out += ["loss", "lr"]
    if any("loss" in r.phases[s] for r in runs for s in SPLITS):
        out.append("phase loss")
    meters = sorted({n for r in runs for s in SPLITS for n in r.phases[s] if n != "loss"})
    if metric_filters:
        meters = [m for m in meters if any(f in m for f in metric_filters)]
    return out + meters


def draw(
    runs: Sequence[RunLogs], metric_filters: Sequence[str] = (), title: str | None = None
) -> tuple[Any, list[str]]:
    """The matplotlib figure of ``runs`` and its panel names.

    Raises:
        PlotError: nothing to plot, or matplotlib is missing.
    """
    names = panels(runs, metric_filters)
    if not names:
        raise PlotError(
            "nothing to plot: the runs' logs hold no loss, learning rate or meter values"
            + (f" matching --metrics {list(metric_filters)}" if metric_filters else "")
            + "."
        )
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    ncols = min(3, len(names))
    nrows = math.ceil(len(names) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.1 * nrows), squeeze=False)
    several = len(runs) > 1
    for ax, name in zip(axes.flat, names):
        for i, run in enumerate(runs):
            color = f"C{i % 10}"
            if name in ("loss", "lr"):
                if run.steps:
                    xs = [s[0] for s in run.steps]
                    ys = [s[1] if name == "loss" else s[2] for s in run.steps]
                    ax.plot(
                        xs,
                        ys,
                        color=color,
                        marker="." if len(xs) <= 50 else None,
                        label=run.label if several else "train",
                    )
                continue
            key = "loss" if name == "phase loss" else name
            for split, style, marker in (("train", "-", "o"), ("test", "--", "s")):
                points = run.phases[split].get(key)
                if points:
                    label = f"{run.label} {split}" if several else split
                    ax.plot(
                        [p[0] for p in points],
                        [p[1] for p in points],
                        linestyle=style,
                        marker=marker,
                        markersize=3,
                        color=color,
                        label=label,
                    )
        if name == "loss":
            ax.set(title="loss", xlabel="iteration")
        elif name == "lr":
            ax.set(title="learning rate", xlabel="iteration")
        else:
            ax.set(title=name, xlabel="epoch")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig, names


def plot(
    runs: Sequence[RunLogs],
    out: str,
    metric_filters: Sequence[str] = (),
    dpi: int = 100,
    title: str | None = None,
) -> list[str]:
    """Draw the curves of ``runs`` into the PNG ``out``; return the panel names.

    Raises:
        PlotError: nothing to plot, or matplotlib is missing.
    """
    fig, names = draw(runs, metric_filters, title)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        fig.savefig(out, dpi=dpi, format="png")
    except OSError as err:
        raise PlotError(f"--out {out} cannot be written: {err}") from err
    finally:
        _pyplot().close(fig)
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("runs", nargs="+", help="CHECKPOINT.DIR of each run")
    parser.add_argument(
        "--out",
        default=None,
        help="the PNG to write (default: curves.png in the first run folder)",
    )
    parser.add_argument("--labels", nargs="+", default=None, help="legend name of each run")
    parser.add_argument(
        "--metrics",
        nargs="+",
        default=[],
        help="draw only the meters whose name contains one of these strings",
    )
    parser.add_argument("--title", default=None, help="figure title")
    parser.add_argument("--dpi", type=int, default=100, help="resolution of the PNG")
    args = parser.parse_args(argv)
    out = args.out or os.path.join(args.runs[0], "curves.png")
    if not out.lower().endswith(".png"):
        raise PlotError(f"--out {out}: the output is a PNG; give a file name ending in .png.")
    if args.dpi <= 0:
        raise PlotError(f"--dpi must be positive; got {args.dpi}.")
    _pyplot()  # a missing matplotlib is reported before anything is read
    labels = _labels(args.runs, args.labels)
    runs = [read_run(folder, label) for folder, label in zip(args.runs, labels)]
    names = plot(runs, out, args.metrics, args.dpi, args.title)
    print(f"wrote {out}: {', '.join(names)} of {len(runs)} run(s)")
    return 0


def run_cli(argv: Sequence[str] | None = None) -> int:
    """``main`` with user errors printed as one ``error: ...`` line (exit code 2)."""
    try:
        return main(argv)
    except PlotError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

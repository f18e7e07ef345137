"""The end-of-training summary (HOOKS.SUMMARY): the log, ``summary.json`` and TensorBoard's
HPARAMS view.

Written on the primary rank when training ends, however it ends: ``on_end`` (finished,
early-stopped, stopped on request or interrupted) and ``on_exception`` (``end_reason``
"error", with the error). ``summary.json`` in the checkpoint folder holds::

    {
      "end_reason": "finished" | "early_stop" | "requested" | "interrupted" | "preempted" | "error",
      "stop_reason": why a stop was asked (or null),  "error": "Type: message" (or null),
      "started": ..., "ended": ...,  "wall_time_s": this launch's time,
      "iteration", "max_iteration", "phase_idx", "num_phases", "train_phase_idx",
      "num_train_phases", "world_size",
      "train" / "test": {
          "phases", "time_s", "samples", "images_per_s",
          "final": {"phase_idx", "train_phase_idx", "iteration", "metrics": {name: value}},
          "best": {name: {"value", "mode", "phase_idx", "train_phase_idx", "iteration"}},
          "perf_stats": {section: {"host_ms", "count"[, "cuda_ms"]}}   # PERF_STATS on
      },
      "checkpoints": [paths written by this launch],
      "hparams": {"OPTIMIZER.name": "sgd", ..., "loss/...": ..., "train_step/...": ...}
    }

Metric names are the flattened ``metrics.json`` names (:mod:`vissl.hooks.metrics`). "best"
is the lowest value of a loss (a name ending in ``_loss``) and the highest of a meter. The
per-kind totals and bests are saved in checkpoints, so after a resume they cover the whole
training; ``wall_time_s`` is this launch's.

With ``HOOKS.SUMMARY.HPARAMS`` the resolved config flattened to scalars and strings
(:func:`vissl.utils.hparams.flatten_hparams`), plus what ``task.loss.dump_hparams()`` and the
train step's ``dump_hparams()`` return (prefixed ``loss/`` and ``train_step/``), is in
``"hparams"``; with TensorBoard on it also goes to the HPARAMS view of the run's own event
folder, with the final and best metrics as ``hparams/<name>`` and ``hparams/best_<name>``.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from vissl.hooks.base import Priority, VisslHook
from vissl.hooks.metrics import flatten_metrics, is_finite, phase_metrics, phase_split
from vissl.utils.distributed import get_world_size, is_primary
from vissl.utils.hparams import HParam, flatten_hparams, write_hparams

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def _new_kind() -> dict[str, Any]:
    return {
        "phases": 0,
        "time_s": 0.0,
        "samples": 0,
        "final": None,
        "best": {},
        "perf": {},  # section -> [host ms total, count, cuda ms total, cuda count]
    }


def _batch_samples(task: SelfSupervisionTask) -> int:
    """Samples this rank's last step read (first dimension of the input)."""
    sample = getattr(task.last_batch, "sample", None)
    x = sample.get("input") if isinstance(sample, Mapping) else None
    if isinstance(x, list | tuple) and x:
        x = x[0]  # multi-crop: one tensor per crop, each of the batch size
    if isinstance(x, torch.Tensor) and x.ndim > 0:
        n = int(x.shape[0])
        return n * task.grad_accumulation_steps if task.train else n
    split = "TRAIN" if task.train else "TEST"
    try:
        return int(task.config.DATA[split].BATCHSIZE_PER_REPLICA)
    except (AttributeError, KeyError, TypeError):
        return 0


def _dumped_hparams(owner: Any, prefix: str) -> dict[str, HParam]:
    dump = getattr(owner, "dump_hparams", None)
    if not callable(dump):
        return {}
    try:
        extra = dump()
    except Exception:
        logger.exception("%s.dump_hparams() failed; its hyper-parameters are left out", prefix)
        return {}
    if not isinstance(extra, Mapping):
        logger.warning("%s.dump_hparams() returned %r, not a dict; ignored", prefix, type(extra))
        return {}
    return flatten_hparams(extra, prefix=prefix, sep="/")


def _train_step(task: SelfSupervisionTask) -> Any:
    """The run's train step object (``task.train_step``, set by the trainer), or None."""
    return getattr(task, "train_step", None)


def collect_hparams(task: SelfSupervisionTask) -> dict[str, HParam]:
    """The config flattened, plus the loss's and train step's ``dump_hparams()``."""
    hparams = flatten_hparams(task.config) if isinstance(task.config, Mapping) else {}
    hparams.update(_dumped_hparams(task.loss, "loss"))
    hparams.update(_dumped_hparams(_train_step(task), "train_step"))
    return hparams


class TrainingSummaryHook(VisslHook):
    """Writes the end-of-training summary (see the module docstring).

    Args:
        checkpoint_folder: where ``summary.json`` goes.
        hparams: include the hyper-parameters (and write TensorBoard's HPARAMS view when
            ``task.tensorboard_writer`` exists).
    """

    # Its on_end / on_exception run before SSLTensorboardHook (LOW) closes the writer; its
    # on_phase_start after LogPerfTimeMetricsHook (HIGH) made the phase's perf stats.
    priority = Priority.LOW - 5

    def __init__(self, checkpoint_folder: str, hparams: bool = True) -> None:
        self.checkpoint_folder = checkpoint_folder
        self.hparams = hparams
        self.kinds: dict[str, dict[str, Any]] = {}
        self.summary: dict[str, Any] | None = None
        self._started = _now()
        self._start = time.perf_counter()
        self._phase_start = self._start
        self._phase_samples = 0
        self._perf: Any = None

    # ------------------------------------------------------------------ collecting
    def on_start(self, task: SelfSupervisionTask) -> None:
        self._started = _now()
        self._start = time.perf_counter()
        self.summary = None

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        self._phase_start = time.perf_counter()
        self._phase_samples = 0
        # LogPerfTimeMetricsHook drops task.perf_stats at phase end: keep the object.
        self._perf = task.perf_stats

    def on_step(self, task: SelfSupervisionTask) -> None:
        self._phase_samples += _batch_samples(task)

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        elapsed = time.perf_counter() - self._phase_start
        split = phase_split(task)
        kind = self.kinds.setdefault(split, _new_kind())
        kind["phases"] += 1
        kind["time_s"] += elapsed
        kind["samples"] += self._phase_samples * get_world_size()
        where = {
            "phase_idx": task.phase_idx,
            "train_phase_idx": task.train_phase_idx,
            "iteration": task.iteration,
        }
        metrics = flatten_metrics(phase_metrics(task))
        kind["final"] = {**where, "metrics": metrics}
        for name, value in metrics.items():
            if not is_finite(value):
                continue
            mode = "min" if name.endswith("_loss") else "max"
            best = kind["best"].get(name)
            if (
                best is None
                or (mode == "min" and value < best["value"])
                or (mode == "max" and value > best["value"])
            ):
                kind["best"][name] = {"value": value, "mode": mode, **where}
        perf = self._perf
        self._perf = None
        if perf is not None:
            for section, row in perf.summary().items():
                acc = kind["perf"].setdefault(section, [0.0, 0.0, 0.0, 0.0])
                count = float(row["count"])
                acc[0] += row["host_ms"] * count
                acc[1] += count
                if "cuda_ms" in row:
                    acc[2] += row["cuda_ms"] * count
                    acc[3] += count

    # ------------------------------------------------------------------ the summary
    @staticmethod
    def _end_reason(task: SelfSupervisionTask, error: BaseException | None) -> str:
        reason = str(getattr(task, "end_reason", "") or "")
        if reason:
            return reason
        if error is not None:
            return "interrupted" if isinstance(error, KeyboardInterrupt) else "error"
        if task.stop_training:
            return str(getattr(task, "stop_kind", "") or "requested")
        return "finished"

    @staticmethod
    def _kind_summary(kind: Mapping[str, Any]) -> dict[str, Any]:
        time_s = float(kind["time_s"])
        perf = {}
        for section, (host, count, cuda, cuda_count) in kind["perf"].items():
            row = {"host_ms": host / count if count else 0.0, "count": int(count)}
            if cuda_count:
                row["cuda_ms"] = cuda / cuda_count
            perf[section] = row
        out = {
            "phases": int(kind["phases"]),
            "time_s": round(time_s, 3),
            "samples": int(kind["samples"]),
            "images_per_s": round(kind["samples"] / time_s, 2) if time_s > 0 else None,
            "final": kind["final"],
            "best": kind["best"],
        }
        if perf:
            out["perf_stats"] = perf
        return out

    def build_summary(
        self, task: SelfSupervisionTask, error: BaseException | None = None
    ) -> dict[str, Any]:
        """The summary of ``task`` as it stands (see the module docstring)."""
        summary: dict[str, Any] = {
            "end_reason": self._end_reason(task, error),
            "stop_reason": task.stop_training_reason or None,
            "error": None if error is None else f"{type(error).__name__}: {error}",
            "started": self._started,
            "ended": _now(),
            "wall_time_s": round(time.perf_counter() - self._start, 3),
            "iteration": task.iteration,
            "max_iteration": task.max_iteration,
            "phase_idx": task.phase_idx,
            "num_phases": len(task.phases),
            "train_phase_idx": task.train_phase_idx,
            "num_train_phases": task.num_train_phases,
            "world_size": get_world_size(),
        }
        for split in ("train", "test"):
            if split in self.kinds:
                summary[split] = self._kind_summary(self.kinds[split])
        summary["checkpoints"] = list(task.checkpoints_written)
        if self.hparams:
            summary["hparams"] = collect_hparams(task)
        return summary

    def _finish(self, task: SelfSupervisionTask, error: BaseException | None) -> None:
        if not is_primary():
            return
        summary = self.build_summary(task, error)
        self.summary = summary
        logger.info("%s", format_summary(summary))
        path = os.path.join(self.checkpoint_folder, SUMMARY_FILE)
        os.makedirs(self.checkpoint_folder, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
        logger.info("training summary written to %s", path)
        writer = getattr(task, "tensorboard_writer", None)
        if self.hparams and writer is not None:
            metrics: dict[str, float] = {}
            for split in ("train", "test"):
                kind = summary.get(split)
                if not kind:
                    continue
                for name, value in (kind["final"] or {}).get("metrics", {}).items():
                    if is_finite(value):
                        metrics[f"hparams/{name}"] = value
                for name, best in kind["best"].items():
                    metrics[f"hparams/best_{name}"] = best["value"]
            write_hparams(writer, summary["hparams"], metrics, step=task.iteration)

    def _finish_safely(self, task: SelfSupervisionTask, error: BaseException | None) -> None:
        # A summary that cannot be written must not fail the run, nor keep the hooks after
        # this one from their on_end / on_exception.
        try:
            self._finish(task, error)
        except Exception:
            logger.exception("the training summary could not be written")

    def on_end(self, task: SelfSupervisionTask) -> None:
        self._finish_safely(task, None)

    def on_exception(self, task: SelfSupervisionTask) -> None:
        # The trainer runs on_exception inside its `except` block: the error is current.
        self._finish_safely(task, sys.exc_info()[1])

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"kinds": json.loads(json.dumps(self.kinds))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kinds = state.get("kinds")
        if isinstance(kinds, Mapping):
            self.kinds = {str(k): dict(v) for k, v in kinds.items()}


def _fmt(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _phase(phase_idx: Any, summary: Mapping[str, Any]) -> str:
    """A phase as the console counts them, 1-based (``3/10``); summary.json keeps VISSL's
    0-based ``phase_idx``."""
    if not isinstance(phase_idx, int):
        return str(phase_idx)
    return f"{phase_idx + 1}/{summary.get('num_phases', '?')}"


def format_summary(summary: Mapping[str, Any]) -> str:
    """The summary as a few log lines (phases 1-based, as everywhere on the console)."""
    head = (
        f"training summary: ended {summary['end_reason']}"
        + (f" ({summary['stop_reason']})" if summary.get("stop_reason") else "")
        + (f"; error {summary['error']}" if summary.get("error") else "")
        + f"; iteration {summary['iteration']}/{summary['max_iteration']}, phase "
        f"{summary['phase_idx'] + 1}/{summary['num_phases']}, {summary['wall_time_s']:.1f}s"
    )
    lines = [head]
    for split in ("train", "test"):
        kind = summary.get(split)
        if not kind:
            continue
        final = kind["final"] or {}
        finals = ", ".join(f"{k} {_fmt(v)}" for k, v in final.get("metrics", {}).items())
        bests = ", ".join(
            f"{k} {_fmt(b['value'])} (phase {_phase(b.get('phase_idx'), summary)})"
            for k, b in kind["best"].items()
        )
        speed = kind["images_per_s"]
        lines.append(
            f"  {split}: {kind['phases']} phase(s), {kind['time_s']:.1f}s"
            + (f", {speed:.1f} images/s" if speed is not None else "")
        )
        lines.append(
            f"    final (phase {_phase(final.get('phase_idx'), summary)}): {finals or '-'}"
        )
        lines.append(f"    best: {bests or '-'}")
        for section, row in kind.get("perf_stats", {}).items():
            cuda = f", cuda {row['cuda_ms']:.2f} ms" if "cuda_ms" in row else ""
            lines.append(f"    perf {section}: host {row['host_ms']:.2f} ms x {row['count']}{cuda}")
    checkpoints = summary.get("checkpoints") or []
    lines.append(
        f"  checkpoints: {', '.join(os.path.basename(c) for c in checkpoints) or 'none this run'}"
    )
    return "\n".join(lines)


__all__ = ["SUMMARY_FILE", "TrainingSummaryHook", "collect_hparams", "format_summary"]

"""Per-section timers for the train step.

``perf_timer(name, task.perf_stats)`` returns a shared no-op context when perf stats are
off (``task.perf_stats is None``), so timers cost one function call. When on, each timer
records host time with ``time.perf_counter`` and, on CUDA, a pair of CUDA events that are
read lazily (``Event.query``) — never a synchronize per step. Only :meth:`PerfStats.report`
synchronizes, and it runs every ``PERF_STAT_FREQUENCY`` iterations or at phase end.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Any

import torch

_NULL_CONTEXT = contextlib.nullcontext()

# Sections of the standard train step, in order.
TRAIN_STEP_SECTIONS = (
    "read_sample",
    "forward",
    "loss_compute",
    "loss_all_reduce",
    "meters_update",
    "backward",
    "optimizer_step",
    "train_step_total",
)


class _Timer:
    __slots__ = ("_cuda_start", "_name", "_start", "_stats")

    def __init__(self, name: str, stats: PerfStats) -> None:
        self._name = name
        self._stats = stats
        self._start = 0.0
        self._cuda_start: Any = None

    def __enter__(self) -> _Timer:
        if self._stats.use_cuda:
            self._cuda_start = torch.cuda.Event(enable_timing=True)
            self._cuda_start.record()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self._start
        self._stats.host[self._name].append(elapsed)
        if self._stats.use_cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._stats.pending.append((self._name, self._cuda_start, end))


class PerfStats:
    """Collects host (and CUDA event) times per named section."""

    def __init__(self, use_cuda: bool = False) -> None:
        self.use_cuda = use_cuda and torch.cuda.is_available()
        self.host: dict[str, list[float]] = defaultdict(list)
        self.cuda: dict[str, list[float]] = defaultdict(list)
        self.pending: list[tuple[str, Any, Any]] = []

    def timer(self, name: str) -> _Timer:
        return _Timer(name, self)

    def _drain(self, block: bool) -> None:
        still: list[tuple[str, Any, Any]] = []
        for name, start, end in self.pending:
            if block or end.query():
                if block:
                    end.synchronize()
                self.cuda[name].append(start.elapsed_time(end) / 1000.0)
            else:
                still.append((name, start, end))
        self.pending = still

    def poll(self) -> None:
        """Collect finished CUDA timings without waiting."""
        if self.pending:
            self._drain(block=False)

    def summary(self) -> dict[str, dict[str, float]]:
        """Mean milliseconds and counts per section (synchronizes pending CUDA events)."""
        if self.pending:
            self._drain(block=True)
        out: dict[str, dict[str, float]] = {}
        for name, values in self.host.items():
            row = {"host_ms": 1000.0 * sum(values) / len(values), "count": float(len(values))}
            if self.cuda.get(name):
                row["cuda_ms"] = 1000.0 * sum(self.cuda[name]) / len(self.cuda[name])
            out[name] = row
        return out

    def report_str(self) -> str:
        """A table of mean times per section, in train-step order."""
        rows = self.summary()
        order = [n for n in TRAIN_STEP_SECTIONS if n in rows] + sorted(
            n for n in rows if n not in TRAIN_STEP_SECTIONS
        )
        head = f"{'section':<20}{'host ms':>10}{'cuda ms':>10}{'count':>8}"
        lines = ["perf stats (mean per call):", head]
        for n in order:
            r = rows[n]
            cuda = f"{r['cuda_ms']:>10.2f}" if "cuda_ms" in r else f"{'-':>10}"
            lines.append(f"{n:<20}{r['host_ms']:>10.2f}{cuda}{int(r['count']):>8d}")
        return "\n".join(lines)

    def reset(self) -> None:
        self.host.clear()
        self.cuda.clear()
        self.pending.clear()


def perf_timer(name: str, perf_stats: PerfStats | None) -> contextlib.AbstractContextManager[Any]:
    """A timer for ``name`` when ``perf_stats`` is set, else a shared no-op context."""
    if perf_stats is None:
        return _NULL_CONTEXT
    return perf_stats.timer(name)

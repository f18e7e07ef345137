"""Logging hooks: loss/lr/ETA lines, tqdm progress bar, stdout.json, perf-stats reports."""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any, TextIO

import torch

from vissl.hooks.base import Priority, VisslHook
from vissl.hooks.log_values import read_log_values
from vissl.utils.distributed import is_primary
from vissl.utils.logger import CONSOLE
from vissl.utils.perf_stats import PerfStats

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)


def current_lr(task: SelfSupervisionTask) -> float:
    """Learning rate of the first param group (trunk)."""
    if task.optimizer is None or not task.optimizer.param_groups:
        return 0.0
    return float(task.optimizer.param_groups[0]["lr"])


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (where ``tqdm.auto`` draws a widget)."""
    if "IPython" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        shell = get_ipython()
        return shell is not None and "IPKernelApp" in shell.config
    except Exception:  # an IPython that is not what we expect: no widget
        return False


class _FinalLineBar:
    """A progress bar that draws nothing while the phase runs and, when closed, writes the
    finished bar as one line (tqdm's format): for a stream that is not a terminal."""

    def __init__(self, total: int, desc: str, initial: int, stream: TextIO) -> None:
        self.total, self.desc, self.n, self.initial = total, desc, initial, initial
        self.stream = stream
        self.postfix: dict[str, Any] = {}
        self._start = time.perf_counter()
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, refresh: bool = True, **kwargs: Any) -> None:
        self.postfix = kwargs

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if os.environ.get("TQDM_DISABLE"):  # as tqdm itself: any value turns bars off
            return
        from tqdm import tqdm

        postfix = ", ".join(f"{k}={str(v).strip()}" for k, v in self.postfix.items())
        line = tqdm.format_meter(
            self.n,
            self.total,
            time.perf_counter() - self._start,
            prefix=self.desc,
            postfix=postfix or None,
            initial=self.initial,
        )
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream must not stop training
            pass


class LogLossLrEtaHook(VisslHook):
    """Every LOG_FREQUENCY iterations: log iteration, lr, loss, batch time and ETA.

    Writes the same values as one JSON object per line to ``stdout.json`` and drives a
    progress bar per phase (primary rank only). The loss is read back from the device only
    on those iterations.

    The progress bar goes to ``stream`` (default: ``sys.stderr``). On a terminal (that
    stream and ``sys.stdout`` both TTYs, or a Jupyter kernel) it is a tqdm bar redrawn in
    place at most every 0.5 s; the log handler of :mod:`vissl.utils.logger` clears it,
    writes a log line and redraws it, so log lines never share a line with the bar. The
    last step of a phase completes and closes the bar after that step's log line: the
    finished bar is drawn exactly once. Anywhere else (a file, a pipe, a SLURM log) nothing
    is drawn while the phase runs and the finished bar is written once, as one line, when
    the phase ends.
    """

    priority = Priority.LOW

    def __init__(
        self,
        checkpoint_folder: str,
        progress_bar: bool = True,
        rolling_btime_freq: int = -1,
        stream: TextIO | None = None,
        btime_freq: int | None = None,
    ) -> None:
        # VISSL's signature is (checkpoint_folder, btime_freq): an int second argument
        # (not a bool) or btime_freq= is its rolling batch-time window
        if isinstance(progress_bar, int) and not isinstance(progress_bar, bool):
            rolling_btime_freq, progress_bar = progress_bar, True
        if btime_freq is not None:
            rolling_btime_freq = btime_freq
        self.checkpoint_folder = checkpoint_folder
        self.progress_bar = progress_bar
        self.rolling_btime_freq = rolling_btime_freq
        self.stream = stream
        self._bar: Any = None
        self._start_time = 0.0
        self._last_time = 0.0
        self._step_times: deque[float] = deque(
            maxlen=max(1, rolling_btime_freq) if rolling_btime_freq > 0 else 50
        )
        self._train_start_iteration = 0
        self._train_start_time = 0.0
        self._primary: bool | None = None  # is_primary(), fixed for the run
        self._json: TextIO | None = None  # stdout.json, open while training runs

    def _is_primary(self) -> bool:
        if self._primary is None:
            self._primary = is_primary()
        return self._primary

    def on_start(self, task: SelfSupervisionTask) -> None:
        self._primary = is_primary()
        self._train_start_iteration = task.iteration
        self._train_start_time = time.perf_counter()

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        self._last_time = time.perf_counter()
        self._start_time = self._last_time
        self._close_bar()
        if self.progress_bar and self._is_primary():
            split = "TRAIN" if task.train else "TEST"
            total = task.steps_per_phase(split)
            desc = (
                f"train ep {task.train_phase_idx + 1}/{task.num_train_phases}"
                if task.train
                else f"test after ep {task.train_phase_idx + 1}"
            )
            # a phase resumed mid-way starts from the steps already done
            initial = max(0, int(getattr(task, "local_iteration_num", 0)))
            self._bar = self._make_bar(total, desc, min(initial, total))

    def _make_bar(self, total: int, desc: str, initial: int) -> Any:
        stream = self.stream if self.stream is not None else sys.stderr
        if _in_notebook() or (_isatty(stream) and _isatty(sys.stdout)):
            from tqdm.auto import tqdm

            return tqdm(
                total=total,
                desc=desc,
                initial=initial,
                # read now, not when tqdm was imported (tqdm takes its TQDM_* defaults then)
                disable=bool(os.environ.get("TQDM_DISABLE")),
                file=stream,
                dynamic_ncols=True,
                leave=True,
                mininterval=0.5,
            )
        return _FinalLineBar(total, desc, initial, stream)

    def _close_bar(self) -> None:
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.close()

    def _eta_seconds(self, task: SelfSupervisionTask) -> float:
        done = task.iteration - self._train_start_iteration
        if done <= 0:
            return float("nan")
        elapsed = time.perf_counter() - self._train_start_time
        return elapsed / done * (task.max_iteration - task.iteration)

    def on_step(self, task: SelfSupervisionTask) -> None:
        now = time.perf_counter()
        if task.train:  # batch time and its rolling average are of train steps
            self._step_times.append(now - self._last_time)
        self._last_time = now
        bar = self._bar
        # The phase's last step: the bar is completed and closed after this step's log
        # line, so that its finished state is drawn once (a redraw after the log line
        # followed by close() would draw it twice).
        last = bar is not None and bar.n + 1 >= bar.total
        if bar is not None and not last:
            bar.update(1)
        if task.is_log_iteration and self._is_primary():
            self._log(task, bar)
        if last:
            bar.n += 1
            self._close_bar()

    def _log(self, task: SelfSupervisionTask, bar: Any) -> None:
        """The log line, the ``stdout.json`` record and the bar's postfix of a log iteration."""
        values, _ = read_log_values(task)  # (read once per step, shared with other hooks)
        loss = values.pop("loss")
        times = self._step_times
        btime_ms = 1000.0 * sum(times) / len(times) if times else float("nan")
        record: dict[str, Any] = {
            "iteration": task.iteration,
            "phase_idx": task.phase_idx,
            "train_phase_idx": task.train_phase_idx,
            "ep": task.train_phase_idx,
            "train": task.train,
            "loss": loss,
            "lr": current_lr(task),
            "btime(ms)": round(btime_ms, 2),
        }
        record.update(values)  # task.additional_log_data
        if task.train:
            eta = self._eta_seconds(task)
            record["eta"] = str(datetime.timedelta(seconds=int(eta))) if eta == eta else "unknown"
        if task.device.type == "cuda":
            record["peak_mem(M)"] = round(torch.cuda.max_memory_allocated(task.device) / 2**20, 1)
        if task.train:
            extras = "".join(
                f"; {k}: {v:.4f}" if isinstance(v, float) else f"; {k}: {v}"
                for k, v in record.items()
                if k.startswith("loss.")
            )
            logger.info(
                "[ep: %d/%d] iter: %d/%d; lr: %.5g; loss: %.5f%s; btime(ms): %.1f; eta: %s",
                task.train_phase_idx + 1,
                task.num_train_phases,
                task.iteration,
                task.max_iteration,
                record["lr"],
                loss,
                extras,
                btime_ms,
                record["eta"],
            )
            self._write_json(record)
        if bar is not None:
            bar.set_postfix(loss=f"{loss:.4f}", lr=f"{record['lr']:.4g}", refresh=False)
        if (
            self.rolling_btime_freq > 0
            and task.train
            and task.iteration % self.rolling_btime_freq == 0
        ):
            logger.info(
                "rolling average batch time over %d iterations: %.1f ms",
                len(self._step_times),
                btime_ms,
            )

    def _write_json(self, record: dict[str, Any]) -> None:
        """Append ``record`` to ``stdout.json`` (kept open while training; flushed per line)."""
        if self._json is None or self._json.closed:
            self._json = open(  # closed in on_end / on_exception
                os.path.join(self.checkpoint_folder, "stdout.json"), "a", encoding="utf-8"
            )
        self._json.write(json.dumps(record) + "\n")
        self._json.flush()

    def _close_json(self) -> None:
        if self._json is not None:
            json_file, self._json = self._json, None
            json_file.close()

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        self._close_bar()  # a phase cut short (fewer steps than the bar's total)
        if self._is_primary():
            self._write_phase_record(task)
            elapsed = time.perf_counter() - self._start_time
            logger.info(
                "phase %d/%d (%s) done in %.1fs: average loss %.5f",
                task.phase_idx + 1,
                len(task.phases),
                "train" if task.train else "test",
                elapsed,
                task.phase_average_loss(),
            )

    def _write_phase_record(self, task: SelfSupervisionTask) -> None:
        """A phase-end ``stdout.json`` record of the meters that ask for one
        (``log_to_stdout_json``, e.g. the online monitors), under their flattened
        ``metrics.json`` names::

            {"iteration": 110, "phase_idx": 9, "train_phase_idx": 9, "ep": 9,
             "train": true, "phase_end": true, "train_online_knn_top_1": 97.2, ...}
        """
        from vissl.hooks.metrics import flatten_metrics, phase_split, plain

        meters = [m for m in getattr(task, "meters", ()) if getattr(m, "log_to_stdout_json", False)]
        if not meters:
            return
        split = phase_split(task)
        record: dict[str, Any] = {
            "iteration": task.iteration,
            "phase_idx": task.phase_idx,
            "train_phase_idx": task.train_phase_idx,
            "ep": task.train_phase_idx,
            "train": task.train,
            "phase_end": True,
        }
        record.update(flatten_metrics({f"{split}_{m.name}": plain(m.value) for m in meters}))
        self._write_json(record)

    def on_end(self, task: SelfSupervisionTask) -> None:
        # a stop mid-phase (Ctrl-C, request_stop) skips on_phase_end
        self.on_exception(task)

    def on_exception(self, task: SelfSupervisionTask) -> None:
        self._close_bar()
        self._close_json()


class LogPerfTimeMetricsHook(VisslHook):
    """Turns on per-section perf timers and reports them (HOOKS.PERF_STATS).

    Reports every ``PERF_STAT_FREQUENCY`` train iterations (if > 0), on the console and in
    ``log.txt``, and at each phase end: in ``log.txt`` and TensorBoard, and on the console
    only with ``print_every_phase`` (``PERF_STATS.PRINT_EVERY_PHASE``). The console gets
    the breakdown over the whole run once, in the end-of-training summary.
    """

    priority = Priority.HIGH

    def __init__(
        self,
        perf_stat_frequency: int = -1,
        log_freq: int | None = None,
        print_every_phase: bool = False,
    ) -> None:
        # log_freq: VISSL's name of the argument
        self.perf_stat_frequency = perf_stat_frequency if log_freq is None else log_freq
        self.print_every_phase = bool(print_every_phase)
        self.last_summary: dict[str, dict[str, float]] = {}

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        task.perf_stats = PerfStats(use_cuda=task.device.type == "cuda")

    def on_step(self, task: SelfSupervisionTask) -> None:
        stats = task.perf_stats
        if stats is None:
            return
        stats.poll()
        # Test phases do not advance the iteration: they report at their phase end only.
        if (
            self.perf_stat_frequency > 0
            and task.train
            and task.iteration % self.perf_stat_frequency == 0
        ):
            self._report(task, stats)

    def _report(self, task: SelfSupervisionTask, stats: PerfStats, console: bool = True) -> None:
        self.last_summary = stats.summary()
        if is_primary():
            logger.info(
                "iteration %d, %s",
                task.iteration,
                stats.report_str(),
                extra={} if console else {CONSOLE: False},
            )
        writer = getattr(task, "tensorboard_writer", None)
        if writer is not None:
            for name, row in self.last_summary.items():
                writer.add_scalar(f"Speed/{name}_host_ms", row["host_ms"], task.iteration)
                if "cuda_ms" in row:
                    writer.add_scalar(f"Speed/{name}_cuda_ms", row["cuda_ms"], task.iteration)

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        if task.perf_stats is not None and task.perf_stats.host:
            self._report(task, task.perf_stats, console=self.print_every_phase)
        task.perf_stats = None

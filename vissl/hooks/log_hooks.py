"""Logging hooks: loss/lr/ETA lines, tqdm progress bar, stdout.json, perf-stats reports."""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from vissl.hooks.base import Priority, VisslHook
from vissl.utils.distributed import is_primary
from vissl.utils.perf_stats import PerfStats

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)


def _to_float(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().item()) if value.numel() == 1 else value.tolist()
    return value


def current_lr(task: SelfSupervisionTask) -> float:
    """Learning rate of the first param group (trunk)."""
    if task.optimizer is None or not task.optimizer.param_groups:
        return 0.0
    return float(task.optimizer.param_groups[0]["lr"])


class LogLossLrEtaHook(VisslHook):
    """Every LOG_FREQUENCY iterations: log iteration, lr, loss, batch time and ETA.

    Writes the same values as one JSON object per line to ``stdout.json`` and drives a tqdm
    progress bar with ETA (primary rank only). The loss is read back from the device only
    on those iterations.
    """

    priority = Priority.LOW

    def __init__(
        self, checkpoint_folder: str, progress_bar: bool = True, rolling_btime_freq: int = -1
    ) -> None:
        self.checkpoint_folder = checkpoint_folder
        self.progress_bar = progress_bar
        self.rolling_btime_freq = rolling_btime_freq
        self._bar: Any = None
        self._start_time = 0.0
        self._last_time = 0.0
        self._step_times: deque[float] = deque(
            maxlen=max(1, rolling_btime_freq) if rolling_btime_freq > 0 else 50
        )
        self._train_start_iteration = 0
        self._train_start_time = 0.0

    def on_start(self, task: SelfSupervisionTask) -> None:
        self._train_start_iteration = task.iteration
        self._train_start_time = time.perf_counter()

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        self._last_time = time.perf_counter()
        self._start_time = self._last_time
        if self.progress_bar and is_primary():
            from tqdm.auto import tqdm

            split = "TRAIN" if task.train else "TEST"
            total = task.steps_per_phase(split)
            desc = (
                f"train ep {task.train_phase_idx + 1}/{task.num_train_phases}"
                if task.train
                else f"test after ep {task.train_phase_idx + 1}"
            )
            self._bar = tqdm(
                total=total, desc=desc, dynamic_ncols=True, leave=True, mininterval=0.5
            )

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
        if self._bar is not None:
            self._bar.update(1)
        if not task.is_log_iteration or not is_primary():
            return
        loss = _to_float(task.last_batch.loss) if task.last_batch is not None else float("nan")
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
        for key, value in task.additional_log_data.items():
            record[key] = _to_float(value)
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
                "[ep: %d] iter: %d/%d; lr: %.5g; loss: %.5f%s; btime(ms): %.1f; eta: %s",
                task.train_phase_idx,
                task.iteration,
                task.max_iteration,
                record["lr"],
                loss,
                extras,
                btime_ms,
                record["eta"],
            )
            with open(
                os.path.join(self.checkpoint_folder, "stdout.json"), "a", encoding="utf-8"
            ) as f:
                f.write(json.dumps(record) + "\n")
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{loss:.4f}", lr=f"{record['lr']:.4g}", refresh=False)
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

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if is_primary():
            elapsed = time.perf_counter() - self._start_time
            logger.info(
                "phase %d (%s) done in %.1fs: average loss %.5f",
                task.phase_idx,
                "train" if task.train else "test",
                elapsed,
                task.phase_average_loss(),
            )

    def on_end(self, task: SelfSupervisionTask) -> None:
        # a stop mid-phase (Ctrl-C, request_stop) skips on_phase_end
        self.on_exception(task)

    def on_exception(self, task: SelfSupervisionTask) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class LogPerfTimeMetricsHook(VisslHook):
    """Turns on per-section perf timers and reports them (HOOKS.PERF_STATS).

    Reports every ``PERF_STAT_FREQUENCY`` train iterations (if > 0) and at each phase end.
    """

    priority = Priority.HIGH

    def __init__(self, perf_stat_frequency: int = -1) -> None:
        self.perf_stat_frequency = perf_stat_frequency
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

    def _report(self, task: SelfSupervisionTask, stats: PerfStats) -> None:
        self.last_summary = stats.summary()
        if is_primary():
            logger.info("iteration %d, %s", task.iteration, stats.report_str())
        writer = getattr(task, "tensorboard_writer", None)
        if writer is not None:
            for name, row in self.last_summary.items():
                writer.add_scalar(f"Speed/{name}_host_ms", row["host_ms"], task.iteration)
                if "cuda_ms" in row:
                    writer.add_scalar(f"Speed/{name}_cuda_ms", row["cuda_ms"], task.iteration)

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        if task.perf_stats is not None and task.perf_stats.host:
            self._report(task, task.perf_stats)
        task.perf_stats = None

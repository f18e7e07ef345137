"""TensorBoard: loss, lr and batch time every LOG_FREQUENCY; meters and histograms per phase."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from vissl.hooks.base import Priority, VisslHook
from vissl.hooks.log_hooks import current_lr
from vissl.hooks.log_values import read_log_values
from vissl.utils.distributed import is_primary

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)


class SSLTensorboardHook(VisslHook):
    """Writes scalars to ``<log dir>/tensorboard`` on the primary rank.

    Args:
        log_dir: event folder.
        log_params: parameter histograms at phase end (and every N iterations if > 0).
        log_params_gradients: gradient histograms alongside.
        log_params_every_n_iters: -1: only at phase end.
        flush_every_n_min: flush period.
    """

    priority = Priority.LOW

    def __init__(
        self,
        log_dir: str,
        log_params: bool = True,
        log_params_gradients: bool = True,
        log_params_every_n_iters: int = -1,
        flush_every_n_min: float = 5,
    ) -> None:
        self.log_dir = log_dir
        self.log_params = log_params
        self.log_params_gradients = log_params_gradients
        self.log_params_every_n_iters = log_params_every_n_iters
        self.flush_secs = max(1, int(flush_every_n_min * 60))
        self.writer: Any = None
        self._last = 0.0

    def on_start(self, task: SelfSupervisionTask) -> None:
        if not is_primary():
            return
        from torch.utils.tensorboard import SummaryWriter

        os.makedirs(self.log_dir, exist_ok=True)
        self.writer = SummaryWriter(log_dir=self.log_dir, flush_secs=self.flush_secs)
        task.tensorboard_writer = self.writer
        logger.info("TensorBoard events in %s", self.log_dir)

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        self._last = time.perf_counter()
        self._steps = 0

    def on_step(self, task: SelfSupervisionTask) -> None:
        self._steps += 1
        if self.writer is None or not task.is_log_iteration or not task.train:
            return
        now = time.perf_counter()
        step = task.iteration
        values, _ = read_log_values(task)  # (read once per step, shared with other hooks)
        self.writer.add_scalar("Losses/train_loss", values.pop("loss"), step)
        self.writer.add_scalar("Learning_rate/train", current_lr(task), step)
        self.writer.add_scalar(
            "Speed/Batch_processing_time_ms",
            1000.0 * (now - self._last) / max(1, self._steps),
            step,
        )
        for key, value in values.items():  # task.additional_log_data
            self.writer.add_scalar(f"Losses/train_{key}", value, step)
        self._last, self._steps = now, 0
        if self.log_params_every_n_iters > 0 and step % self.log_params_every_n_iters == 0:
            self._histograms(task)

    def _histograms(self, task: SelfSupervisionTask) -> None:
        if not (self.log_params or self.log_params_gradients):
            return
        for name, param in task.base_model.named_parameters():
            if self.log_params:
                self.writer.add_histogram(
                    f"Parameters/{name}", param.detach().float().cpu(), task.iteration
                )
            if self.log_params_gradients and param.grad is not None:
                self.writer.add_histogram(
                    f"Gradients/{name}", param.grad.detach().float().cpu(), task.iteration
                )

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        if self.writer is None:
            return
        split = "train" if task.train else "test"
        phase = task.train_phase_idx
        self.writer.add_scalar(f"Losses/{split}_epoch_loss", task.phase_average_loss(), phase)
        for meter in task.meters:
            value = meter.value
            if isinstance(value, dict):
                for metric, per_output in value.items():
                    items = (
                        per_output.items() if isinstance(per_output, dict) else [(0, per_output)]
                    )
                    for out_name, v in items:
                        try:
                            self.writer.add_scalar(
                                f"Meters/{split}_{meter.name}/{metric}/{out_name}", float(v), phase
                            )
                        except (TypeError, ValueError):
                            pass
        if task.train and self.log_params:
            self._histograms(task)
        self.writer.flush()

    def on_end(self, task: SelfSupervisionTask) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    on_exception = on_end

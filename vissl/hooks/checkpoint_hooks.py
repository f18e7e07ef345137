"""Checkpoints at phase end (and every N iterations), and ``metrics.json`` per phase."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from vissl.hooks.base import Priority, VisslHook
from vissl.utils.checkpoint import save_checkpoint
from vissl.utils.distributed import barrier, is_primary

logger = logging.getLogger(__name__)


def _plain(value: Any) -> Any:
    """Meter values to JSON-able values (tensors to floats, keys to str)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        return float(value.item())
    return value


class LogMetricsHook(VisslHook):
    """At phase end, append meter values and the phase's mean loss to ``metrics.json``."""

    priority = Priority.NORMAL

    def __init__(self, checkpoint_folder: str) -> None:
        self.checkpoint_folder = checkpoint_folder
        self.last_metrics: dict[str, Any] = {}

    def on_phase_end(self, task: Any) -> None:
        split = "train" if task.train else "test"
        record: dict[str, Any] = {
            "iteration": task.iteration,
            "phase_idx": task.phase_idx,
            "train_phase_idx": task.train_phase_idx,
            f"{split}_loss": task.phase_average_loss(),
        }
        for meter in task.meters:
            value = _plain(meter.value)
            record[f"{split}_{meter.name}"] = value
            if is_primary():
                logger.info("%s %s: %s", split, meter.name, value)
        self.last_metrics = record
        if is_primary():
            with open(
                os.path.join(self.checkpoint_folder, "metrics.json"), "a", encoding="utf-8"
            ) as f:
                f.write(json.dumps(record) + "\n")


class CheckpointHook(VisslHook):
    """Save checkpoints: every CHECKPOINT_FREQUENCY train phases, the last train phase
    always (as ``model_final_checkpoint_phase{N}.torch``), and every
    CHECKPOINT_ITER_FREQUENCY iterations when > 0. Rank 0 writes; others wait.
    """

    priority = Priority.LOW + 10  # after logging and metrics, before nothing else

    def __init__(
        self, checkpoint_folder: str, phase_frequency: int = 1, iter_frequency: int = -1
    ) -> None:
        self.checkpoint_folder = checkpoint_folder
        self.phase_frequency = max(1, int(phase_frequency))
        self.iter_frequency = int(iter_frequency)
        self.saved: list[str] = []

    def _save(self, task: Any, filename: str) -> None:
        if is_primary():
            self.saved.append(save_checkpoint(self.checkpoint_folder, filename, task.state_dict()))
        barrier()

    def on_step(self, task: Any) -> None:
        if (
            self.iter_frequency > 0
            and task.train
            and task.iteration % self.iter_frequency == 0
            and task.iteration < task.max_iteration
        ):
            self._save(task, f"model_iteration{task.iteration}.torch")

    def on_phase_end(self, task: Any) -> None:
        if not task.train:
            return
        is_last = task.train_phase_idx + 1 == task.num_train_phases
        if is_last:
            self._save(task, f"model_final_checkpoint_phase{task.phase_idx}.torch")
        elif (task.train_phase_idx + 1) % self.phase_frequency == 0:
            self._save(task, f"model_phase{task.phase_idx}.torch")

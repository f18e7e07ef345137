"""When to checkpoint (phase ends, every N iterations), and ``metrics.json`` per phase.

What a checkpoint holds, writing it and resuming are in :mod:`vissl.trainer.checkpointing`.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from vissl.hooks.base import Priority, VisslHook
from vissl.hooks.metrics import phase_metrics, phase_split
from vissl.utils.checkpoint import remove_stale_temporary_files
from vissl.utils.distributed import is_primary

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)


class LogMetricsHook(VisslHook):
    """At phase end, append meter values and the phase's mean loss to ``metrics.json``."""

    priority = Priority.NORMAL

    def __init__(self, checkpoint_folder: str) -> None:
        self.checkpoint_folder = checkpoint_folder
        self.last_metrics: dict[str, Any] = {}

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        # the names are defined in one place (vissl.hooks.metrics), which early stopping
        # and the end-of-training summary read too
        record = phase_metrics(task)
        split = phase_split(task)
        self.last_metrics = record
        if is_primary():
            for meter in task.meters:
                logger.info("%s %s: %s", split, meter.name, record[f"{split}_{meter.name}"])
            with open(
                os.path.join(self.checkpoint_folder, "metrics.json"), "a", encoding="utf-8"
            ) as f:
                f.write(json.dumps(record) + "\n")


class CheckpointHook(VisslHook):
    """Save checkpoints: every CHECKPOINT_FREQUENCY train phases, the last train phase
    always (as ``model_final_checkpoint_phase{N}.torch``), and every
    CHECKPOINT_ITER_FREQUENCY iterations when > 0. Rank 0 writes; others wait.
    ``keep_last`` > 0 keeps only that many intermediate checkpoints.
    """

    priority = Priority.LOW + 10  # after logging and metrics

    def __init__(
        self,
        checkpoint_folder: str,
        phase_frequency: int = 1,
        iter_frequency: int = -1,
        keep_last: int = -1,
    ) -> None:
        self.checkpoint_folder = checkpoint_folder
        self.phase_frequency = max(1, int(phase_frequency))
        self.iter_frequency = int(iter_frequency)
        self.keep_last = int(keep_last)
        self.saved: list[str] = []

    def on_start(self, task: SelfSupervisionTask) -> None:
        if is_primary():
            remove_stale_temporary_files(self.checkpoint_folder)

    def _save(self, task: SelfSupervisionTask, filename: str, phase_complete: bool) -> None:
        # What a checkpoint holds and how it is written live in vissl.trainer.checkpointing
        # (behind task.save_checkpoint); this hook only decides when.
        path = task.save_checkpoint(filename, phase_complete, keep_last=self.keep_last)
        if path:
            self.saved.append(path)

    def on_step(self, task: SelfSupervisionTask) -> None:
        if (
            self.iter_frequency > 0
            and task.train
            and task.iteration % self.iter_frequency == 0
            and task.iteration < task.max_iteration
        ):
            self._save(task, f"model_iteration{task.iteration}.torch", phase_complete=False)

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        if not task.train:
            return
        is_last = task.train_phase_idx + 1 == task.num_train_phases
        if is_last:
            self._save(task, f"model_final_checkpoint_phase{task.phase_idx}.torch", True)
        elif (task.train_phase_idx + 1) % self.phase_frequency == 0:
            self._save(task, f"model_phase{task.phase_idx}.torch", True)

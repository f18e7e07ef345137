"""``IBOTHook`` (VISSL's name): the teacher of ``ibot_loss`` and ``dinov2_loss``.

Declared by those losses through ``required_hooks()``; nothing checks the loss's name.

- ``on_forward``: the loss's schedules move to this iteration and train phase (teacher
  temperatures), then the teacher runs on the UNMASKED global views (no gradients, under
  the run's autocast), its head given the masks when it scores masked patches only; the
  result goes to ``loss.teacher_output``.
- ``on_update``: after each optimizer step the teacher follows the student,
  ``teacher = m * teacher + (1 - m) * student``, ``m = loss.teacher_momentum_at(iteration,
  max_iteration)`` (a cosine to 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vissl.hooks.base import Priority, VisslHook
from vissl.models.momentum import ema_update_

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask


class IBOTHook(VisslHook):
    """Teacher forward and EMA update of a masked self-distillation loss.

    The loss provides ``teacher`` (bound by ``bind_model``), ``set_schedule_position
    (iteration, epoch)``, ``run_teacher(inputs)`` and ``teacher_momentum_at(iteration,
    max_iteration)``.

    Args:
        loss: the loss whose teacher this drives.
    """

    priority = Priority.HIGH

    def __init__(self, loss: Any) -> None:
        self.loss = loss
        #: The teacher momentum used at the last update (for logging and tests).
        self.last_momentum = float("nan")

    def on_forward(self, task: SelfSupervisionTask) -> None:
        loss = self.loss
        if loss.teacher is None:
            raise RuntimeError(
                f"{type(loss).__name__}.bind_model was not called: no teacher (the trainer "
                "calls it when it builds the task)."
            )
        loss.set_schedule_position(int(task.iteration), max(int(task.train_phase_idx), 0))
        with torch.no_grad(), task.precision.autocast():
            loss.teacher_output = loss.run_teacher(task.last_batch.sample["input"])

    def on_update(self, task: SelfSupervisionTask) -> None:
        loss = self.loss
        assert loss.teacher is not None
        momentum = loss.teacher_momentum_at(int(task.iteration), int(task.max_iteration))
        ema_update_(loss.teacher, task.base_model, momentum)
        self.last_momentum = momentum

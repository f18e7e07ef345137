"""``MomentumTeacherHook``: the one hook of every momentum-teacher method.

Declared by the loss through ``required_hooks()`` (DINO, iBOT, DINOv2, MSN, MoCo v2,
MoCo v3, BYOL, I-JEPA); the loss is a
:class:`~vissl.models.momentum.MomentumTeacherOwner` holding a
:class:`~vissl.models.momentum.MomentumTeacher`. Nothing checks the loss's name.

- ``on_forward``: the loss's teacher inputs of this micro-batch
  (``loss.teacher_loss_inputs(sample, step)``: the teacher's output on what it sees,
  temperatures ...), computed without gradients under the run's autocast, on the
  sample as the student saw it (channels-last when the run is), go to
  ``task.last_batch.loss_inputs``: the standard step passes them to the loss as keyword
  arguments. The loss keeps no state between the hook and its ``forward``.
- ``on_update``: after each optimizer step the teacher follows the student,
  ``teacher = m * teacher + (1 - m) * student``, ``m`` the teacher's schedule at
  ``iteration / max_iteration``; ``m`` is logged as ``teacher_momentum`` (and kept in
  :attr:`MomentumTeacherHook.last_momentum`).
- ``on_phase_end`` (train phases, primary rank), for a loss with a ``collapse_hint``: a
  warning when the phase's mean loss sits at ``loss.uniform_loss``, the value of a
  collapsed (uniform) teacher and student.

Compile, FSDP sharding and resume of the copy are the task's (it finds the copy as the
loss's submodule); the checkpoint holds it as ``loss.<teacher_state_key>.*``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from vissl.hooks.base import Priority, VisslHook
from vissl.models.momentum import TeacherStep, schedule_position
from vissl.utils.distributed import is_primary

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)

#: the key of the logged EMA factor (``task.additional_log_data``)
MOMENTUM_LOG_KEY = "teacher_momentum"


class MomentumTeacherHook(VisslHook):
    """Teacher inputs and EMA updates of a loss that owns a momentum teacher.

    Args:
        owner: the loss (a :class:`~vissl.models.momentum.MomentumTeacherOwner`).
        collapse_tolerance: relative distance to ``owner.uniform_loss`` reported as collapse.
    """

    priority = Priority.HIGH

    def __init__(self, owner: Any, collapse_tolerance: float = 0.01) -> None:
        self.owner = owner
        self.collapse_tolerance = float(collapse_tolerance)
        #: The teacher momentum used at the last update (for logging and tests).
        self.last_momentum = float(getattr(owner, "momentum", float("nan")))

    @property
    def loss(self) -> Any:
        """VISSL's name of the owner."""
        return self.owner

    def _teacher(self) -> Any:
        teacher = self.owner.momentum_teacher
        if teacher is None:
            raise RuntimeError(
                f"{type(self.owner).__name__}.bind_model was not called: no teacher (the "
                "trainer calls it when it builds the task)."
            )
        return teacher

    def on_forward(self, task: SelfSupervisionTask) -> None:
        self._teacher()
        step = TeacherStep(
            int(task.iteration),
            max(int(task.train_phase_idx), 0),
            bool(task.train),
            bool(getattr(task, "channels_last", False)),
        )
        with torch.no_grad(), task.precision.autocast():
            inputs = self.owner.teacher_loss_inputs(task.last_batch.sample, step)
        task.last_batch.loss_inputs.update(inputs)

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        # pair the copy with the student again at the first update of the phase (and
        # re-check their dtypes and devices): the per-step update reuses the pairing
        teacher = self.owner.momentum_teacher
        if teacher is not None:
            teacher.refresh()

    def on_update(self, task: SelfSupervisionTask) -> None:
        where = schedule_position(int(task.iteration), int(task.max_iteration))
        self.last_momentum = self._teacher().update(task.base_model, where)
        log = getattr(task, "additional_log_data", None)
        if isinstance(log, dict):
            log[MOMENTUM_LOG_KEY] = self.last_momentum

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        hint = getattr(self.owner, "collapse_hint", None)
        if not hint or not task.train or not is_primary():
            return
        uniform = float(self.owner.uniform_loss)
        mean = task.phase_average_loss()
        if mean == mean and abs(mean - uniform) <= self.collapse_tolerance * uniform:
            logger.warning(
                "%s %.4f is at ln(output_dim) = %.4f (phase %d): teacher and student "
                "have collapsed to a uniform output. %s",
                type(self.owner).__name__,
                mean,
                uniform,
                task.phase_idx,
                hint,
            )

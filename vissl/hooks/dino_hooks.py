"""``DINOHook``: DINO's teacher forward, its temperature, its EMA update, collapse warning.

Declared by ``dino_loss`` through ``required_hooks()``; nothing checks the loss's name.

- ``on_forward``: the teacher temperature of this iteration, and the teacher's output on
  the crops of ``crops_for_teacher`` (no gradients, under the run's autocast) into
  ``loss.teacher_output``.
- ``on_update``: after each optimizer step the teacher follows the student,
  ``teacher = m * teacher + (1 - m) * student``, with DINO's cosine momentum
  ``m = 1 - (1 - momentum) * (cos(pi * iteration / max_iteration) + 1) / 2``.
- ``on_phase_end`` (train phases, primary rank): a warning when the phase's mean loss sits
  at ``ln(output_dim)``, the value of a collapsed (uniform) teacher and student.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from vissl.hooks.base import Priority, VisslHook
from vissl.models.momentum import cosine_momentum, ema_update_
from vissl.utils.distributed import is_primary

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)


def teacher_temperature(iteration: int, temp_min: float, temp_max: float, warmup: int) -> float:
    """DINO's teacher temperature: linear from ``temp_min`` to ``temp_max`` over ``warmup``."""
    if warmup <= 0 or iteration >= warmup:
        return temp_max
    return temp_min + (temp_max - temp_min) * iteration / warmup


def single_tensor(output: Any, what: str) -> torch.Tensor:
    """The one tensor of a model output (a tensor, or lists of one element around it)."""
    while not isinstance(output, torch.Tensor):
        items = list(output)
        if len(items) != 1:
            raise ValueError(
                f"dino_loss expects one output tensor from {what} (one head chain ending in "
                f"a dino_head), got {len(items)} outputs."
            )
        output = items[0]
    return output


class DINOHook(VisslHook):
    """Teacher forward and EMA update of a :class:`~vissl.losses.dino_loss.DINOLoss`.

    Args:
        loss: the DINO loss whose teacher this drives.
        collapse_tolerance: relative distance to ``ln(output_dim)`` reported as collapse.
    """

    priority = Priority.HIGH

    def __init__(self, loss: Any, collapse_tolerance: float = 0.01) -> None:
        self.loss = loss
        self.collapse_tolerance = float(collapse_tolerance)
        #: The teacher momentum used at the last update (for logging and tests).
        self.last_momentum = float(loss.momentum)

    def on_forward(self, task: SelfSupervisionTask) -> None:
        loss = self.loss
        teacher = loss.teacher
        if teacher is None:
            raise RuntimeError(
                "dino_loss.bind_model was not called: no teacher (the trainer calls it when "
                "it builds the task)."
            )
        loss.teacher_temp = teacher_temperature(
            int(task.iteration),
            loss.teacher_temp_min,
            loss.teacher_temp_max,
            loss.teacher_temp_warmup_iters,
        )
        crops = loss.teacher_input(task.last_batch.sample["input"])
        with torch.no_grad(), task.precision.autocast():
            out = teacher(crops)
        loss.teacher_output = single_tensor(out, "the teacher")

    def on_update(self, task: SelfSupervisionTask) -> None:
        loss = self.loss
        assert loss.teacher is not None
        momentum = cosine_momentum(int(task.iteration), int(task.max_iteration), loss.momentum)
        ema_update_(loss.teacher, task.base_model, momentum)
        self.last_momentum = momentum

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        if not task.train or not is_primary():
            return
        uniform = float(self.loss.uniform_loss)
        mean = task.phase_average_loss()
        if mean == mean and abs(mean - uniform) <= self.collapse_tolerance * uniform:
            logger.warning(
                "DINO loss %.4f is at ln(output_dim) = %.4f (phase %d): teacher and student "
                "have collapsed to a uniform output. Try a lower teacher temperature "
                "(LOSS.dino_loss.teacher_temp_max), a higher center momentum "
                "(LOSS.dino_loss.ema_center), a lower learning rate or a longer warm-up.",
                mean,
                uniform,
                task.phase_idx,
            )

"""Hooks the SwAV losses declare through ``required_hooks()``.

- :class:`NormalizePrototypesHook`: L2-normalise the prototypes at start and after every
  optimizer step (``normalize_last_layer``), in the model and in any copy the loss keeps
  (the momentum encoder of ``swav_momentum_loss``).
- :class:`SwAVTrackingHook`: keep the loss's iteration equal to the task's (queue start,
  hard assignments), tell it whether the phase trains (test phases do not fill the queue),
  and warn when a train phase's loss sits at ``ln K`` (collapsed codes).
- :class:`SwAVMomentumHook`: run the momentum encoder on the batch (its scores give the
  codes) and follow the model by EMA after every optimizer step.

The hooks meet the loss on attributes (``iteration``, ``uniform_loss``,
``momentum_encoder``, ...), not on its class.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vissl.hooks.base import Priority, VisslHook
from vissl.utils.distributed import is_primary

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)

#: A train phase whose mean loss is within this fraction of ln K is reported as collapsed.
COLLAPSE_RELATIVE_TOLERANCE = 0.005


def normalize_all_prototypes(*modules: nn.Module | None) -> int:
    """Normalise the prototypes of every SwAV head inside ``modules``; returns how many heads."""
    count = 0
    for module in modules:
        if module is None:
            continue
        for m in module.modules():
            normalize = getattr(m, "normalize_prototypes", None)
            if callable(normalize):
                normalize()
                count += 1
    return count


class NormalizePrototypesHook(VisslHook):
    """L2-normalise SwAV's prototypes once at start and after each optimizer step.

    Runs late (``Priority.LOW``) so that a momentum encoder's EMA update comes first.
    """

    priority = Priority.LOW

    def on_start(self, task: SelfSupervisionTask) -> None:
        found = normalize_all_prototypes(task.base_model, task.loss)
        if found == 0:
            logger.warning(
                "NormalizePrototypesHook: the model has no swav_head; nothing to normalise."
            )

    def on_update(self, task: SelfSupervisionTask) -> None:
        normalize_all_prototypes(task.base_model, task.loss)


class SwAVTrackingHook(VisslHook):
    """Keep ``task.loss.iteration`` equal to ``task.iteration`` (optimizer steps done),
    put the loss in train/eval mode with the phase, and warn on collapse.

    The collapse check reads the phase's mean loss once, at the end of each train phase
    (no per-step device read): a loss stuck at ``ln K`` means every sample gets the same,
    uniform codes.
    """

    priority = Priority.HIGH

    def __init__(self, tolerance: float = COLLAPSE_RELATIVE_TOLERANCE) -> None:
        self.tolerance = float(tolerance)

    def on_forward(self, task: SelfSupervisionTask) -> None:
        loss = task.loss
        set_iteration = getattr(loss, "set_iteration", None)
        if callable(set_iteration):
            set_iteration(task.iteration)
        train = bool(task.train)
        if loss.training != train:
            loss.train(train)

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        uniform = getattr(task.loss, "uniform_loss", None)
        if not task.train or uniform is None or not is_primary():
            return
        mean = task.phase_average_loss()
        if mean == mean and abs(mean - float(uniform)) <= self.tolerance * float(uniform):
            logger.warning(
                "SwAV loss %.4f is stuck at ln K = %.4f (phase %d): the codes have collapsed "
                "(every sample gets the same uniform assignment). Try a smaller epsilon, a "
                "queue (LOSS.<swav loss>.queue.queue_length) at small batch sizes, freezing "
                "the prototypes for the first iterations (MODEL.TEMP_FROZEN_PARAMS_ITER_MAP) "
                "or a lower learning rate.",
                mean,
                float(uniform),
                task.phase_idx,
            )


class SwAVMomentumHook(VisslHook):
    """The momentum encoder of ``swav_momentum_loss``.

    ``on_forward``: run ``task.loss.momentum_encoder`` on the batch, without gradients,
    and store its output in ``task.loss.momentum_output`` (in eval mode from
    ``task.loss.momentum_eval_mode_iter_start`` on). ``on_update``: EMA update,
    ``encoder = m * encoder + (1 - m) * model``, with ``m = task.loss.momentum``.
    """

    priority = Priority.NORMAL

    def on_forward(self, task: SelfSupervisionTask) -> None:
        loss: Any = task.loss
        encoder: nn.Module | None = getattr(loss, "momentum_encoder", None)
        if encoder is None:
            raise RuntimeError(
                "SwAVMomentumHook: the loss has no momentum encoder; call "
                "loss.bind_model(model) first (the trainer does)."
            )
        train_mode = bool(task.train) and task.iteration < int(loss.momentum_eval_mode_iter_start)
        if encoder.training != train_mode:
            encoder.train(train_mode)
        with torch.no_grad(), task.precision.autocast():
            output = encoder(task.last_batch.sample["input"])
        if isinstance(output, list | tuple) and len(output) == 1:
            output = output[0]
        loss.momentum_output = output

    def on_update(self, task: SelfSupervisionTask) -> None:
        from vissl.models.momentum import ema_update_

        loss: Any = task.loss
        ema_update_(loss.momentum_encoder, task.base_model, float(loss.momentum))

"""Hooks the SwAV losses declare through ``required_hooks()``.

- :class:`NormalizePrototypesHook`: L2-normalise the prototypes at start and after every
  optimizer step (``normalize_last_layer``), in the model and in any copy the loss keeps
  (the momentum encoder of ``swav_momentum_loss``).
- :class:`SwAVTrackingHook`: keep the loss's iteration equal to the task's (queue start,
  hard assignments), tell it whether the phase trains (test phases do not fill the queue),
  and warn when a train phase's loss sits at ``ln K`` (collapsed codes).
- :class:`SwAVMomentumHook`: run the momentum encoder on the ``crops_for_assign`` crops
  (their scores give the codes) with the model's BatchNorm statistics, and follow the
  model by EMA after every optimizer step.

The hooks meet the loss on attributes (``iteration``, ``uniform_loss``,
``momentum_encoder``, ...), not on its class.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from vissl.hooks.base import Priority, VisslHook
from vissl.models.momentum import MomentumTeacher, build_momentum_schedule, copy_buffers_
from vissl.utils.distributed import is_primary

if TYPE_CHECKING:
    from vissl.models.momentum import EmaTensors
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)

#: A train phase whose mean loss is within this fraction of ln K is reported as collapsed.
COLLAPSE_RELATIVE_TOLERANCE = 0.005


def normalize_all_prototypes(*modules: nn.Module | None) -> int:
    """Normalise the prototypes of every SwAV head inside ``modules``; returns how many heads."""
    found = prototype_normalizers(*modules)
    for normalize in found:
        normalize()
    return len(found)


def prototype_normalizers(*modules: nn.Module | None) -> list[Any]:
    """The ``normalize_prototypes`` methods of every SwAV head inside ``modules``, in order."""
    found: list[Any] = []
    for module in modules:
        if module is None:
            continue
        for m in module.modules():
            normalize = getattr(m, "normalize_prototypes", None)
            if callable(normalize):
                found.append(normalize)
    return found


class NormalizePrototypesHook(VisslHook):
    """L2-normalise SwAV's prototypes once at start and after each optimizer step.

    Runs late (``Priority.LOW``) so that a momentum encoder's EMA update comes first. The
    start of a resumed run (optimizer steps already done) leaves the restored prototypes
    as they are: they were normalised after the last step, and normalising them again
    changes their last bits, so the run would not resume bitwise.

    The heads are found once (at start and at each phase start, or when the task's model
    or loss is replaced), not by a walk of the module tree every step.
    """

    priority = Priority.LOW

    def __init__(self) -> None:
        self._normalizers: list[Any] = []
        # the (model, loss) the normalizers were found in
        self._owners: tuple[Any, Any] | None = None

    def _find(self, task: SelfSupervisionTask) -> list[Any]:
        owners = self._owners
        if owners is None or owners[0] is not task.base_model or owners[1] is not task.loss:
            self._normalizers = prototype_normalizers(task.base_model, task.loss)
            self._owners = (task.base_model, task.loss)
        return self._normalizers

    def on_start(self, task: SelfSupervisionTask) -> None:
        self._owners = None
        found = self._find(task)
        if int(getattr(task, "iteration", 0)) > 0:
            return
        for normalize in found:
            normalize()
        if not found:
            logger.warning(
                "NormalizePrototypesHook: the model has no swav_head; nothing to normalise."
            )

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        self._owners = None

    def on_update(self, task: SelfSupervisionTask) -> None:
        for normalize in self._find(task):
            normalize()


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


def assign_crops(inputs: Any, crops_for_assign: Sequence[int], num_crops: int) -> Any:
    """The crops of ``inputs`` whose codes are computed, in ``crops_for_assign`` order.

    ``inputs`` is the model's input: a list of one tensor per crop (``multicrop_collator``)
    or one tensor of ``num_crops`` crop-major blocks of rows (``simclr_collator``). All the
    crops in order: ``inputs`` itself.

    Raises:
        ValueError: ``inputs`` does not hold ``num_crops`` crops.
    """
    crops = [int(c) for c in crops_for_assign]
    if crops == list(range(num_crops)):
        return inputs
    if isinstance(inputs, list | tuple):
        if len(inputs) != num_crops:
            raise ValueError(
                f"swav_momentum_loss: the batch holds {len(inputs)} crop tensors but "
                f"num_crops={num_crops}; check the multi-crop transform and LOSS num_crops."
            )
        return [inputs[c] for c in crops]
    if isinstance(inputs, torch.Tensor):
        rows = int(inputs.shape[0])
        if rows % num_crops != 0:
            raise ValueError(
                f"swav_momentum_loss: {rows} input rows are not num_crops={num_crops} crops "
                "of each sample; check the collator and LOSS num_crops."
            )
        b = rows // num_crops
        return torch.cat([inputs[c * b : (c + 1) * b] for c in crops])
    raise ValueError(
        "swav_momentum_loss: the momentum encoder takes the crops of a tensor or a list of "
        f"tensors, not a {type(inputs).__name__} (named inputs: MULTI_INPUT_HEAD_MAPPING)."
    )


class SwAVMomentumHook(VisslHook):
    """The momentum encoder of ``swav_momentum_loss`` (VISSL's ``SwAVMomentumHook``).

    ``on_forward`` (after the model's forward): copy the model's buffers (BatchNorm running
    statistics) into ``task.loss.momentum_encoder``, then run it without gradients on the
    ``crops_for_assign`` crops only (their scores give the codes), in eval mode from
    ``task.loss.momentum_eval_mode_iter_start`` on, and store its output in
    ``task.loss.momentum_output``. ``on_update``: EMA of the parameters,
    ``encoder = m * encoder + (1 - m) * model`` with ``m = task.loss.momentum``, and the
    buffers copied again.

    In eval mode the encoder therefore normalises with the model's running statistics,
    as in VISSL (``_update_momentum_network`` copies every ``running_*`` buffer); here every
    buffer is copied (the BatchNorm counters as well, which no forward of the encoder
    reads). The pairs of tensors are gathered once, ``on_start`` (after the FSDP task
    sharded the model and the encoder: the pairs are then matching shards), or at first
    use when no trainer calls ``on_start``.
    """

    priority = Priority.NORMAL

    def __init__(self) -> None:
        # the MomentumTeacher driving the loss's encoder (in a list: not a module of the
        # hook, so momentum_copies(hook) does not find the loss's copy a second time)
        self._driver: list[MomentumTeacher] = []

    @staticmethod
    def _encoder(task: SelfSupervisionTask) -> nn.Module:
        encoder: nn.Module | None = getattr(task.loss, "momentum_encoder", None)
        if encoder is None:
            raise RuntimeError(
                "SwAVMomentumHook: the loss has no momentum encoder; call "
                "loss.bind_model(model) first (the trainer does)."
            )
        return encoder

    def teacher(self, task: SelfSupervisionTask) -> MomentumTeacher:
        """The :class:`~vissl.models.momentum.MomentumTeacher` of the loss's encoder: a
        constant ``loss.momentum``, the buffers copied at each update."""
        encoder = self._encoder(task)
        momentum = float(cast(float, task.loss.momentum))
        if not self._driver or self._driver[0].module is not encoder:
            self._driver = [
                MomentumTeacher(
                    encoder, momentum, teacher_mode=False, copy_buffers=True, copy=False
                )
            ]
        driver = self._driver[0]
        if driver.momentum_at(None) != momentum:
            driver.schedule = build_momentum_schedule("constant", momentum)
        return driver

    def _paired(self, task: SelfSupervisionTask) -> EmaTensors:
        return self.teacher(task).paired_tensors(task.base_model)

    def on_start(self, task: SelfSupervisionTask) -> None:
        # Pair now, with the task built (sharded, compiled, resumed): under FSDP the model's
        # parameters are then its shards; inside a step (after its forward) they are not.
        self._paired(task)

    def on_forward(self, task: SelfSupervisionTask) -> None:
        loss: Any = task.loss
        encoder = self._encoder(task)
        tensors = self._paired(task)
        copy_buffers_(tensors)
        train_mode = bool(task.train) and task.iteration < int(loss.momentum_eval_mode_iter_start)
        if encoder.training != train_mode:
            encoder.train(train_mode)
        inputs = assign_crops(
            task.last_batch.sample["input"], loss.crops_for_assign, int(loss.num_crops)
        )
        with torch.no_grad(), task.precision.autocast():
            output = encoder(inputs)
        if isinstance(output, list | tuple) and len(output) == 1:
            output = output[0]
        loss.momentum_output = output

    def on_update(self, task: SelfSupervisionTask) -> None:
        self.teacher(task).update(task.base_model, None)

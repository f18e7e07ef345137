"""``standard_train_step``: one iteration, as a class of overridable sections.

Order (hooks in brackets; a perf timer wraps each section)::

    read_sample -> forward [on_forward] -> loss_compute -> loss_all_reduce
    -> meters_update [on_loss_and_meter]
    train phases only: -> backward [on_backward] -> optimizer_step [on_update]

With ``OPTIMIZER.GRAD_ACCUMULATION_STEPS`` > 1 the loss all-reduce (for logging) runs
once per step, on the mean of the micro-batches' losses, after the last one.

Precision (autocast, loss scaling) and gradient reduction (DDP, manual all-reduce) are
strategy objects on the task; this step never branches on them. Nothing is read back from
the device here: the loss stays a tensor (hooks read it every LOG_FREQUENCY iterations).

Weighted losses: a loss may return ``{"loss": l, "loss_weight": w, ...}`` (e.g. ``w`` = the
number of valid samples). The step then trains on, and logs, the weighted mean
``sum(w_i * l_i) / sum(w_i)`` over all micro-batches of the step and all ranks:

- each micro-batch backpropagates ``w_i * l_i`` (not ``l_i / k``), and the step keeps the
  local sums ``[sum w_i * l_i, sum w_i]`` on the device;
- after the last micro-batch one small all-reduce (SUM) of those two numbers gives the
  global ``S`` and ``W``; the logged loss (``task.last_batch.loss``) is ``S / W`` and
  ``task.last_batch.loss_weight`` is ``W``;
- the reducer has averaged the gradients over ranks, so they are multiplied by
  ``world_size / W`` (one ``torch._foreach_mul_`` per device, no host read) before
  ``on_backward``, i.e. before gradient clipping and before a GradScaler unscales them
  (a positive factor commutes with the unscale and keeps infs infs). A step whose total
  weight is 0 is not rescaled (its gradients are zero).

A loss without ``loss_weight`` takes exactly the unweighted path (``l / k`` per
micro-batch, the plain mean over ranks): results are bitwise those of a plain loss.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from vissl.data.batch import construct_sample_for_model, move_to_device, to_channels_last
from vissl.meters.update import update_meters
from vissl.trainer.train_steps import register_train_step
from vissl.utils.distributed import all_reduce_mean, all_reduce_sum, get_world_size
from vissl.utils.perf_stats import perf_timer

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask


_TINY = torch.finfo(torch.float32).tiny
_NULL_CONTEXT = contextlib.nullcontext()
# Entries of a dict loss that are not logged as ``loss.<key>`` extras.
_RESERVED_LOSS_KEYS = ("loss", "loss_weight")


class LastBatchInfo:
    """What the last step saw and produced (``task.last_batch``).

    ``loss_weight`` is None unless the loss returned one. During a micro-batch it is that
    micro-batch's local weight; after the step, the step's total weight over all its
    micro-batches and ranks (a float32 device tensor).
    """

    __slots__ = (
        "log_values",
        "loss",
        "loss_extras",
        "loss_inputs",
        "loss_weight",
        "model_output",
        "sample",
        "target",
    )

    def __init__(self) -> None:
        self.sample: dict[str, Any] = {}
        self.model_output: Any = None
        self.loss: torch.Tensor | None = None
        self.loss_extras: dict[str, torch.Tensor] = {}
        #: keyword arguments of this micro-batch's loss call beyond ``(output, target)``,
        #: put here by the ``on_forward`` hooks (e.g. the teacher's output and temperature,
        #: :class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook`)
        self.loss_inputs: dict[str, Any] = {}
        self.loss_weight: torch.Tensor | None = None
        self.target: Any = None
        #: what :func:`vissl.hooks.log_values.read_log_values` read on a log iteration
        self.log_values: Any = None


def as_loss_weight(value: Any, loss: torch.Tensor, loss_name: str) -> torch.Tensor:
    """A loss's ``loss_weight`` as a detached float32 0-d tensor on the loss's device.

    A Python number (or a CPU tensor, read for free) must be finite and non-negative. A
    one-element tensor on an accelerator is not checked: reading it would make the host
    wait for the device every step. There, a negative weight silently skews the mean and
    a non-finite one makes the logged loss non-finite (``HOOKS.CHECK_NAN`` reports it).

    Raises:
        TypeError: not a real number or a one-element real tensor.
        ValueError: a negative or non-finite number.
    """
    fix = (
        "loss_weight must be a finite number >= 0 (e.g. the number of valid samples), as a "
        "Python number or a one-element real tensor."
    )
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            raise TypeError(
                f"loss {loss_name} returned loss_weight=<tensor of shape {tuple(value.shape)}, "
                f"dtype {value.dtype}>: {fix}"
            )
        if value.device.type != "cpu":
            return value.detach().reshape(()).to(device=loss.device, dtype=torch.float32)
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"loss {loss_name} returned loss_weight={value!r} (a {type(value).__name__}): {fix}"
        )
    weight = float(value)
    if not (math.isfinite(weight) and weight >= 0):
        raise ValueError(f"loss {loss_name} returned loss_weight={value!r}: {fix}")
    # A fill kernel, not a host-to-device copy: no synchronisation.
    return torch.full((), weight, dtype=torch.float32, device=loss.device)


@register_train_step("standard_train_step")
class StandardTrainStep:
    """The default train step. Subclass it and override one section to customise."""

    def __call__(self, task: SelfSupervisionTask) -> Any:
        task.last_batch = LastBatchInfo()
        stats = task.perf_stats
        accumulation = task.grad_accumulation_steps if task.train else 1
        with perf_timer("train_step_total", stats):
            # sum of the micro-batches' local losses: reduced over ranks once, after the last
            step_loss: torch.Tensor | None = None
            # Weighted losses only: this rank's [sum w_i * loss_i, sum w_i] over micro-batches.
            weighted: torch.Tensor | None = None
            for micro in range(accumulation):
                task.micro_step = micro
                try:
                    local_loss = self._forward_and_loss(
                        task, stats, sync=micro == accumulation - 1, reduce=accumulation == 1
                    )
                except StopIteration:
                    if micro > 0:  # the data ended inside an accumulation: drop it
                        task.optimizer.zero_grad(set_to_none=True)
                    raise
                weight = task.last_batch.loss_weight
                if micro > 0 and (weight is None) != (weighted is None):
                    raise ValueError(
                        f"loss {type(task.loss).__name__} returned loss_weight for some "
                        "micro-batches of an accumulated step but not for others: return it "
                        "for every batch or for none."
                    )
                if weight is not None:
                    term = torch.stack([(local_loss.detach().float() * weight).reshape(()), weight])
                    weighted = term if weighted is None else weighted.add_(term)
                elif accumulation > 1:
                    local = local_loss.detach().float()
                    step_loss = local.clone() if step_loss is None else step_loss.add_(local)
                if task.train:
                    with perf_timer("backward", stats):
                        self.backward(task, local_loss)
            if weighted is not None:
                with perf_timer("loss_all_reduce", stats):
                    if accumulation > 1 and task.last_batch.loss_extras:
                        self.reduce_loss_for_logging(task, local_loss)  # the extras
                    total_weight = self._reduce_weighted_loss(task, weighted)
                task.accumulate_loss(task.last_batch.loss, weight=total_weight)
                if task.train:
                    with perf_timer("backward", stats):
                        self._normalize_weighted_gradients(task, total_weight)
            else:
                if step_loss is not None:
                    # The step's loss is the mean over its micro-batches, not the last
                    # one's; one all-reduce per step, not one per micro-batch.
                    with perf_timer("loss_all_reduce", stats):
                        self.reduce_loss_for_logging(task, step_loss.div_(accumulation))
                task.accumulate_loss(task.last_batch.loss)
            if task.train:
                task.run_hooks("on_backward")
                with perf_timer("optimizer_step", stats):
                    self.optimizer_step(task)
                task.run_hooks("on_update")
                task.num_updates += task.get_global_batchsize()
        return task

    def _forward_and_loss(
        self, task: SelfSupervisionTask, stats: Any, sync: bool, reduce: bool = True
    ) -> torch.Tensor:
        """read_sample -> forward [on_forward] -> loss -> all-reduce -> meters [on_loss_and_meter].

        With ``reduce`` False (a micro-batch of an accumulated step) the loss is not
        all-reduced here: ``task.last_batch.loss`` holds this rank's micro-batch loss until
        the step reduces the mean of its micro-batches once. A weighted loss without
        extras is not reduced here either: the step reduces its weighted sums.
        """
        with perf_timer("read_sample", stats):
            sample = self.read_sample(task)
        task.last_batch.sample = sample
        task.last_batch.target = sample["target"]
        task.last_batch.loss_inputs = {}
        with self.forward_context(task, sync=sync):
            with perf_timer("forward", stats):
                model_output = self.forward(task, sample)
            task.last_batch.model_output = model_output
            task.run_hooks("on_forward")

            task.last_batch.loss_weight = None
            with perf_timer("loss_compute", stats):
                local_loss = self.compute_loss(task, model_output, sample)
            if reduce and (task.last_batch.loss_weight is None or task.last_batch.loss_extras):
                with perf_timer("loss_all_reduce", stats):
                    self.reduce_loss_for_logging(task, local_loss)
            else:
                task.last_batch.loss = local_loss.detach()
            with perf_timer("meters_update", stats):
                self.update_meters(task, model_output, sample)
            task.run_hooks("on_loss_and_meter")
        return local_loss

    # ------------------------------------------------------------------ sections
    def read_sample(self, task: SelfSupervisionTask) -> dict[str, Any]:
        """Next batch from the data iterator, reshaped and moved to the task's device;
        with ``DATA.TRAIN.TRANSFORMS_ON_DEVICE``, its colour transforms applied there
        (a step that overrides this method must call ``task.device_transforms["TRAIN"]``
        itself).

        Raises StopIteration at the end of the phase (the trainer ends the phase on it).
        """
        batch = next(task.data_iterator)
        sample = construct_sample_for_model(batch, task)
        tail = task.device_transforms.get("TRAIN") if task.train else None
        if tail is not None and getattr(tail, "takes_host_input", False):
            # DATA.TRAIN.DECODE_ON_DEVICE: the tail reads the encoded bytes on the host
            # (the decoder takes host buffers) and returns the decoded views on the device
            # of data_idx: the bytes never make a round trip through the device.
            data_idx = move_to_device(sample["data_idx"], task.device)
            sample["input"] = tail(sample["input"], data_idx, task.phase_idx)
            tail = None
        sample = move_to_device(sample, task.device)
        if tail is not None:  # DATA.TRAIN.TRANSFORMS_ON_DEVICE: the colour transforms
            sample["input"] = tail(sample["input"], sample["data_idx"], task.phase_idx)
        if task.channels_last:
            sample["input"] = to_channels_last(sample["input"])
        return sample

    def forward_context(
        self, task: SelfSupervisionTask, sync: bool = True
    ) -> contextlib.AbstractContextManager[Any]:
        """Grad mode, the reducer's context (e.g. ``no_sync``) and autocast, entered in
        that order (an ``ExitStack`` when more than grad mode is needed)."""
        grad_mode = torch.enable_grad() if task.train else torch.no_grad()
        contexts: list[contextlib.AbstractContextManager[Any]] = []
        if task.train:
            contexts.append(task.grad_reducer.context(task.model))
            contexts.append(self.sync_context(task, sync))
        contexts.append(task.precision.autocast())
        # fp32 on one process: every context but grad mode is a no-op; skip the stack
        needed = [c for c in contexts if type(c) is not contextlib.nullcontext]
        if not needed:
            return grad_mode
        stack = contextlib.ExitStack()
        stack.enter_context(grad_mode)
        for context in needed:
            stack.enter_context(context)
        return stack

    @staticmethod
    def sync_context(
        task: SelfSupervisionTask, sync: bool
    ) -> contextlib.AbstractContextManager[Any]:
        """DDP's ``no_sync`` for micro-batches that must not all-reduce gradients yet."""
        if sync:
            return _NULL_CONTEXT
        no_sync = getattr(task.model, "no_sync", None)
        if no_sync is None:
            return _NULL_CONTEXT
        return no_sync()  # type: ignore[no-any-return]

    def forward(self, task: SelfSupervisionTask, sample: dict[str, Any]) -> Any:
        output = task.model(sample["input"])
        if isinstance(output, list | tuple) and len(output) == 1:
            output = output[0]
        return output

    def compute_loss(
        self, task: SelfSupervisionTask, model_output: Any, sample: dict[str, Any]
    ) -> torch.Tensor:
        """The loss to backpropagate: ``task.loss(model_output, target, **loss_inputs)``,
        ``loss_inputs`` what the ``on_forward`` hooks handed the loss for this micro-batch
        (``task.last_batch.loss_inputs``; none for most losses).

        A dict result: the ``loss`` entry is backpropagated; an optional ``loss_weight``
        (validated by :func:`as_loss_weight`) goes to ``task.last_batch.loss_weight`` and
        makes the step use the weighted mean (see the module docstring); the other entries
        are logged (``task.last_batch.loss_extras``).
        """
        inputs = task.last_batch.loss_inputs
        if inputs:
            result = task.loss(model_output, sample["target"], **inputs)
        else:
            result = task.loss(model_output, sample["target"])
        if isinstance(result, Mapping):
            name = type(task.loss).__name__
            if "loss" not in result:
                raise ValueError(
                    f"loss {name} returned a dict without a 'loss' entry "
                    f"(keys: {sorted(result)}); the 'loss' entry is what is backpropagated."
                )
            loss: torch.Tensor = result["loss"]
            if "loss_weight" in result:
                task.last_batch.loss_weight = as_loss_weight(result["loss_weight"], loss, name)
            task.last_batch.loss_extras = {
                k: v for k, v in result.items() if k not in _RESERVED_LOSS_KEYS
            }
            return loss
        return result  # type: ignore[no-any-return]

    def reduce_loss_for_logging(self, task: SelfSupervisionTask, local_loss: torch.Tensor) -> None:
        """Average the detached loss (and dict extras) over ranks, for logging only."""
        extras = task.last_batch.loss_extras
        if extras and task.world_size == 1:
            # nothing to reduce: the same float32 values, without a stack and its views
            task.last_batch.loss = local_loss.detach().float()
            for key, v in extras.items():
                value = torch.as_tensor(v).detach().float().to(local_loss.device)
                task.additional_log_data[f"loss.{key}"] = value
        elif extras:
            values = torch.stack(
                [local_loss.detach().float()]
                + [
                    torch.as_tensor(v).detach().float().to(local_loss.device)
                    for v in extras.values()
                ]
            )
            all_reduce_mean(values)
            task.last_batch.loss = values[0]
            for i, key in enumerate(extras, start=1):
                task.additional_log_data[f"loss.{key}"] = values[i]
        elif task.world_size > 1:
            task.last_batch.loss = all_reduce_mean(local_loss.detach().float().clone())
        else:
            task.last_batch.loss = local_loss.detach()

    def update_meters(
        self, task: SelfSupervisionTask, model_output: Any, sample: dict[str, Any]
    ) -> None:
        """Update the meters, without the rows the sampler added as padding.

        ``sample["data_valid"]`` is 0 for the repeats a ``DistributedSampler`` pads each
        rank's share with. Meters with ``supports_valid_mask`` get it as ``valid=`` (no
        host sync). Other meters get the padding rows removed in TEST phases (boolean
        indexing: one host sync per step); in train phases they see every row, as in VISSL.
        """
        if not task.meters or (task.train and not task.enable_training_meter):
            return
        update_meters(
            task.meters,
            model_output,
            sample["target"],
            sample.get("data_valid"),
            drop_padding=not task.train,
        )

    def backward(self, task: SelfSupervisionTask, local_loss: torch.Tensor) -> None:
        """Backward of one (micro-)batch.

        With ``OPTIMIZER.GRAD_ACCUMULATION_STEPS`` = k > 1 this runs for each of the k
        micro-batches of a step (``task.micro_step`` = 0..k-1): gradients are zeroed on the
        first, the loss is divided by k, and gradients are synchronised across ranks only
        on the last. ``on_forward``/``on_loss_and_meter`` fire per micro-batch,
        ``on_backward``/``on_update`` once per optimizer step.

        With a ``loss_weight`` w (``task.last_batch.loss_weight``), ``w * loss`` is
        backpropagated instead; the step divides by the total weight after the last one.
        """
        accumulation = task.grad_accumulation_steps
        micro = task.micro_step
        last = micro == accumulation - 1
        if micro == 0:
            task.optimizer.zero_grad(set_to_none=True)
        weight = getattr(task.last_batch, "loss_weight", None)
        if weight is not None:
            with self.sync_context(task, sync=last):
                task.precision.backward(local_loss * weight)
        elif accumulation == 1:
            task.precision.backward(local_loss)
        else:
            with self.sync_context(task, sync=last):
                task.precision.backward(local_loss / accumulation)
        if last:
            task.grad_reducer.after_backward(task.model)

    @staticmethod
    def _reduce_weighted_loss(task: SelfSupervisionTask, sums: torch.Tensor) -> torch.Tensor:
        """Sum ``[sum w*loss, sum w]`` over ranks; log ``S / W``; return ``W`` (on the device)."""
        all_reduce_sum(sums)
        total = sums[1]
        # A step of total weight 0 logs 0 (its weighted sum is 0), not 0/0.
        task.last_batch.loss = sums[0] / total.clamp_min(_TINY)
        task.last_batch.loss_weight = total
        return total

    @staticmethod
    def _normalize_weighted_gradients(
        task: SelfSupervisionTask, total_weight: torch.Tensor
    ) -> None:
        """Turn the rank-averaged ``sum w_i * grad_i`` into the weighted mean's gradient.

        The reducer averaged over ranks: ``avg_r(sum_{i in r} w_i g_i) * world / W`` is
        ``sum_i w_i g_i / W``. Weight 0: factor 1 (the gradients are 0; no 0 * inf).
        """
        world_size = get_world_size()
        factor = torch.where(
            total_weight > 0, world_size / total_weight, torch.ones_like(total_weight)
        )
        grads: dict[torch.device, list[torch.Tensor]] = {}
        for group in task.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    grads.setdefault(p.grad.device, []).append(p.grad)
        for device, device_grads in grads.items():
            device_factor = factor.to(device, non_blocking=True)
            dense = [g for g in device_grads if not g.is_sparse]
            if dense:
                torch._foreach_mul_(dense, device_factor)
            for g in device_grads:
                if g.is_sparse:
                    g.mul_(device_factor)

    def optimizer_step(self, task: SelfSupervisionTask) -> None:
        where = task.where
        if where >= 1.0:
            raise RuntimeError(
                f"optimizer step at where={where:.4f} >= 1: more iterations ran than the "
                "schedule expects (was the data loader resized after the task was built?)"
            )
        task.param_schedulers.apply(task.optimizer, where, "step")
        task.precision.step(task.optimizer)

"""``standard_train_step``: one iteration, as a class of overridable sections.

Order (hooks in brackets; a perf timer wraps each section)::

    read_sample -> forward [on_forward] -> loss_compute -> loss_all_reduce
    -> meters_update [on_loss_and_meter]
    train phases only: -> backward [on_backward] -> optimizer_step [on_update]

Precision (autocast, loss scaling) and gradient reduction (DDP, manual all-reduce) are
strategy objects on the task; this step never branches on them. Nothing is read back from
the device here: the loss stays a tensor (hooks read it every LOG_FREQUENCY iterations).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from vissl.data.batch import construct_sample_for_model, move_to_device, to_channels_last
from vissl.trainer.train_steps import register_train_step
from vissl.utils.distributed import all_reduce_mean, get_world_size
from vissl.utils.perf_stats import perf_timer

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask


class LastBatchInfo:
    """What the last step saw and produced (``task.last_batch``)."""

    __slots__ = ("loss", "loss_extras", "model_output", "sample", "target")

    def __init__(self) -> None:
        self.sample: dict[str, Any] = {}
        self.model_output: Any = None
        self.loss: torch.Tensor | None = None
        self.loss_extras: dict[str, torch.Tensor] = {}
        self.target: Any = None


@register_train_step("standard_train_step")
class StandardTrainStep:
    """The default train step. Subclass it and override one section to customise."""

    def __call__(self, task: SelfSupervisionTask) -> Any:
        task.last_batch = LastBatchInfo()
        stats = task.perf_stats
        accumulation = task.grad_accumulation_steps if task.train else 1
        with perf_timer("train_step_total", stats):
            step_loss: torch.Tensor | None = None  # sum of the micro-batches' logged losses
            for micro in range(accumulation):
                task.micro_step = micro
                try:
                    local_loss = self._forward_and_loss(task, stats, sync=micro == accumulation - 1)
                except StopIteration:
                    if micro > 0:  # the data ended inside an accumulation: drop it
                        task.optimizer.zero_grad(set_to_none=True)
                    raise
                if accumulation > 1:
                    logged = task.last_batch.loss
                    step_loss = logged.clone() if step_loss is None else step_loss.add_(logged)
                if task.train:
                    with perf_timer("backward", stats):
                        self.backward(task, local_loss)
            if step_loss is not None:
                # The step's loss is the mean over its micro-batches, not the last one's.
                task.last_batch.loss = step_loss.div_(accumulation)
            task.accumulate_loss(task.last_batch.loss)
            if task.train:
                task.run_hooks("on_backward")
                with perf_timer("optimizer_step", stats):
                    self.optimizer_step(task)
                task.run_hooks("on_update")
                task.num_updates += task.get_global_batchsize()
        return task

    def _forward_and_loss(self, task: SelfSupervisionTask, stats: Any, sync: bool) -> torch.Tensor:
        """read_sample -> forward [on_forward] -> loss -> all-reduce -> meters [on_loss_and_meter]."""
        with perf_timer("read_sample", stats):
            sample = self.read_sample(task)
        task.last_batch.sample = sample
        task.last_batch.target = sample["target"]
        with self.forward_context(task, sync=sync):
            with perf_timer("forward", stats):
                model_output = self.forward(task, sample)
            task.last_batch.model_output = model_output
            task.run_hooks("on_forward")

            with perf_timer("loss_compute", stats):
                local_loss = self.compute_loss(task, model_output, sample)
            with perf_timer("loss_all_reduce", stats):
                self.reduce_loss_for_logging(task, local_loss)
            with perf_timer("meters_update", stats):
                self.update_meters(task, model_output, sample)
            task.run_hooks("on_loss_and_meter")
        return local_loss

    # ------------------------------------------------------------------ sections
    def read_sample(self, task: SelfSupervisionTask) -> dict[str, Any]:
        """Next batch from the data iterator, reshaped and moved to the task's device.

        Raises StopIteration at the end of the phase (the trainer ends the phase on it).
        """
        batch = next(task.data_iterator)
        sample = construct_sample_for_model(batch, task)
        sample = move_to_device(sample, task.device)
        if task.channels_last:
            sample["input"] = to_channels_last(sample["input"])
        return sample

    def forward_context(self, task: SelfSupervisionTask, sync: bool = True) -> contextlib.ExitStack:
        """Grad mode, the reducer's context (e.g. ``no_sync``) and autocast."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.enable_grad() if task.train else torch.no_grad())
        if task.train:
            stack.enter_context(task.grad_reducer.context(task.model))
            stack.enter_context(self.sync_context(task, sync))
        stack.enter_context(task.precision.autocast())
        return stack

    @staticmethod
    def sync_context(
        task: SelfSupervisionTask, sync: bool
    ) -> contextlib.AbstractContextManager[Any]:
        """DDP's ``no_sync`` for micro-batches that must not all-reduce gradients yet."""
        no_sync = getattr(task.model, "no_sync", None)
        if sync or no_sync is None:
            return contextlib.nullcontext()
        return no_sync()  # type: ignore[no-any-return]

    def forward(self, task: SelfSupervisionTask, sample: dict[str, Any]) -> Any:
        output = task.model(sample["input"])
        if isinstance(output, list | tuple) and len(output) == 1:
            output = output[0]
        return output

    def compute_loss(
        self, task: SelfSupervisionTask, model_output: Any, sample: dict[str, Any]
    ) -> torch.Tensor:
        """The loss to backpropagate. A dict result: ``loss`` entry, others logged."""
        result = task.loss(model_output, sample["target"])
        if isinstance(result, Mapping):
            if "loss" not in result:
                raise ValueError(
                    f"loss {type(task.loss).__name__} returned a dict without a 'loss' entry "
                    f"(keys: {sorted(result)}); the 'loss' entry is what is backpropagated."
                )
            task.last_batch.loss_extras = {k: v for k, v in result.items() if k != "loss"}
            return result["loss"]  # type: ignore[no-any-return]
        return result  # type: ignore[no-any-return]

    def reduce_loss_for_logging(self, task: SelfSupervisionTask, local_loss: torch.Tensor) -> None:
        """Average the detached loss (and dict extras) over ranks, for logging only."""
        extras = task.last_batch.loss_extras
        if extras:
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
        elif get_world_size() > 1:
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
        target = sample["target"]
        valid = sample.get("data_valid")
        outputs = [model_output] if isinstance(model_output, torch.Tensor) else model_output
        if not (
            isinstance(valid, torch.Tensor)
            and isinstance(target, torch.Tensor)
            and valid.ndim == 1
            and valid.shape[0] == target.shape[0]
            and isinstance(outputs, list | tuple)
            and all(
                isinstance(o, torch.Tensor) and o.ndim >= 1 and o.shape[0] == valid.shape[0]
                for o in outputs
            )
        ):
            valid = None  # no per-row flags that line up with the outputs
        keep = None
        for meter in task.meters:
            if valid is None:
                meter.update(model_output, target)
            elif getattr(meter, "supports_valid_mask", False):
                meter.update(model_output, target, valid=valid)
            elif task.train:
                meter.update(model_output, target)
            else:
                if keep is None:
                    keep = valid != 0
                if isinstance(model_output, torch.Tensor):
                    meter.update(model_output[keep], target[keep])
                else:
                    meter.update([o[keep] for o in outputs], target[keep])

    def backward(self, task: SelfSupervisionTask, local_loss: torch.Tensor) -> None:
        """Backward of one (micro-)batch.

        With ``OPTIMIZER.GRAD_ACCUMULATION_STEPS`` = k > 1 this runs for each of the k
        micro-batches of a step (``task.micro_step`` = 0..k-1): gradients are zeroed on the
        first, the loss is divided by k, and gradients are synchronised across ranks only
        on the last. ``on_forward``/``on_loss_and_meter`` fire per micro-batch,
        ``on_backward``/``on_update`` once per optimizer step.
        """
        accumulation = task.grad_accumulation_steps
        micro = task.micro_step
        last = micro == accumulation - 1
        if micro == 0:
            task.optimizer.zero_grad(set_to_none=True)
        if accumulation == 1:
            task.precision.backward(local_loss)
        else:
            with self.sync_context(task, sync=last):
                task.precision.backward(local_loss / accumulation)
        if last:
            task.grad_reducer.after_backward(task.model)

    def optimizer_step(self, task: SelfSupervisionTask) -> None:
        where = task.where
        if where >= 1.0:
            raise RuntimeError(
                f"optimizer step at where={where:.4f} >= 1: more iterations ran than the "
                "schedule expects (was the data loader resized after the task was built?)"
            )
        task.param_schedulers.apply(task.optimizer, where, "step")
        task.precision.step(task.optimizer)

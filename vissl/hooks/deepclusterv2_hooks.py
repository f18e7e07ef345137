"""The hooks ``deepclusterv2_loss`` declares through ``required_hooks()`` (VISSL's names).

- :class:`InitMemoryHook` (``on_start``): fill the loss's memory with a first forward pass
  over the training data when it holds nothing (a fresh run, or a resume whose memory could
  not be restored); a resumed run with its memory restored skips the pass.
- :class:`ClusterMemoryHook` (``on_phase_start``): at the start of every train phase,
  k-means over the memories of all processes gives the centroids and the assignments the
  phase trains on. A phase resumed in its middle keeps the checkpoint's centroids and
  assignments and writes the memory on from where the interrupted run stopped.

The hooks meet the loss on its attributes and methods (``init_memory``, ``cluster_memory``,
``memory_ready``, ``start_idx``, ...), not on its class.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from vissl.hooks.base import Priority, VisslHook
from vissl.utils.distributed import is_primary

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)


def _train_batches(task: SelfSupervisionTask) -> Iterator[tuple[Any, torch.Tensor]]:
    """``(input, target)`` of every batch of one pass over the training data, read as the
    train step reads them (device, device-side transforms, channels-last)."""
    from vissl.data.batch import construct_sample_for_model, move_to_device

    loader = task.dataloaders["TRAIN"]
    reader = getattr(task.train_step, "read_sample", None)
    saved = task.data_iterator
    task.data_iterator = iter(loader)
    try:
        while True:
            try:
                if callable(reader):
                    sample = reader(task)
                else:  # a train step that is a plain function
                    sample = move_to_device(
                        construct_sample_for_model(next(task.data_iterator), task), task.device
                    )
            except StopIteration:
                return
            yield sample["input"], sample["target"]
    finally:
        task.data_iterator = saved


def _expected_memory_rows(task: SelfSupervisionTask) -> int | None:
    """Samples of one epoch on this process, from the training loader (None if unknown)."""
    loader = task.dataloaders.get("TRAIN")
    sampler = getattr(loader, "sampler", None)
    per_rank = getattr(sampler, "num_samples", None)
    batch = getattr(loader, "batch_size", None)
    if not isinstance(per_rank, int) or not isinstance(batch, int) or batch <= 0:
        return None
    return per_rank - per_rank % batch if getattr(loader, "drop_last", False) else per_rank


class InitMemoryHook(VisslHook):
    """Fill the DeepCluster-v2 memory before training (VISSL's ``on_start`` pass).

    The pass runs the model in training mode without gradients on the ``crops_for_mb``
    crops of every training batch of epoch 0 (the same images and augmentations the first
    epoch then trains on).
    """

    priority = Priority.HIGH

    def on_start(self, task: SelfSupervisionTask) -> None:
        loss: Any = task.loss
        if "TRAIN" not in task.dataloaders or task.train_phase_idx + 1 >= task.num_train_phases:
            return  # nothing left to train
        dataset_size = len(task.datasets["TRAIN"])
        rows = _expected_memory_rows(task)
        if loss.num_train_samples != dataset_size or (
            rows is not None and rows != loss.local_memory_size
        ):
            # the run sets num_train_samples from the data set before building the loss
            raise RuntimeError(
                f"deepclusterv2_loss: the memory is sized for {loss.num_train_samples} "
                f"samples ({loss.local_memory_size} rows per process) but the training data "
                f"has {dataset_size} ({rows} per process and epoch); build the loss with "
                "num_train_samples = len(the training data set)."
            )
        if loss.memory_ready:
            if is_primary():
                logger.info("DeepCluster-v2 memory restored from the checkpoint: no first pass")
            return
        model = task.base_model
        was_training = model.training
        model.train(True)

        def forward(crops: list[torch.Tensor]) -> Any:
            with task.precision.autocast():
                out = model(crops)
            if isinstance(out, list | tuple) and len(out) == 1:
                out = out[0]
            return out

        try:
            loss.init_memory(_train_batches(task), forward)
        finally:
            model.train(was_training)


class ClusterMemoryHook(VisslHook):
    """k-means over the memory at the start of every train phase (VISSL's
    ``on_phase_start``); centroids drawn from ``(SEED_VALUE, train phase, clustering)``."""

    priority = Priority.HIGH

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        if not task.train:
            return
        loss: Any = task.loss
        if not loss.memory_ready:
            raise RuntimeError(
                "ClusterMemoryHook: the DeepCluster-v2 memory is empty at the start of a train "
                "phase; InitMemoryHook fills it at on_start (is it attached?)."
            )
        if task.local_iteration_num > 0:
            # Resumed inside the phase: the checkpoint holds this phase's centroids and
            # assignments; the memory rows of the batches already trained on are written.
            steps = task.local_iteration_num * task.grad_accumulation_steps
            loss.start_idx = steps * int(loss.batch_size)
            return
        loss.cluster_memory(seed=int(task.config.SEED_VALUE), epoch=task.train_phase_idx)

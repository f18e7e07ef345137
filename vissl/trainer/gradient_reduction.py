"""Gradient-reduction strategies, chosen once from config.

- :class:`NoReduction`: one process.
- :class:`DDPReduction`: ``DistributedDataParallel`` reduces gradients during backward.
- :class:`ManualReduction` (``DISTRIBUTED.MANUAL_GRADIENT_REDUCTION``): forward and backward
  run under DDP's ``no_sync``; after backward, gradients are all-reduced in flat buckets
  asynchronously and averaged. Needed with activation checkpointing. Public APIs only.

The step calls ``with reducer.context(model): ...forward/backward...`` and then
``reducer.after_backward(model)``; it never checks which strategy it has.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from vissl.utils.distributed import get_world_size


class NoReduction:
    """Nothing to reduce (a single process)."""

    name = "none"

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        return model

    def context(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def after_backward(self, model: nn.Module) -> None:
        pass


class DDPReduction(NoReduction):
    """Wrap the model in DDP; DDP all-reduces gradients during backward."""

    name = "ddp"

    def __init__(
        self,
        broadcast_buffers: bool = True,
        bucket_cap_mb: float = 25,
        find_unused_parameters: bool = False,
    ) -> None:
        self.broadcast_buffers = broadcast_buffers
        self.bucket_cap_mb = bucket_cap_mb
        self.find_unused_parameters = find_unused_parameters

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise (e.g. feature extraction)
        return nn.parallel.DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            output_device=device.index if device.type == "cuda" else None,
            broadcast_buffers=self.broadcast_buffers,
            bucket_cap_mb=self.bucket_cap_mb,
            find_unused_parameters=self.find_unused_parameters,
        )


class ManualReduction(DDPReduction):
    """DDP's ``no_sync`` during forward/backward, then bucketed async all-reduce."""

    name = "manual"

    def __init__(self, bucket_cap_mb: float = 25, broadcast_buffers: bool = True) -> None:
        super().__init__(broadcast_buffers=broadcast_buffers, bucket_cap_mb=bucket_cap_mb)
        self._bucket_bytes = int(bucket_cap_mb * 1024 * 1024)

    def context(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        no_sync = getattr(model, "no_sync", None)
        return no_sync() if callable(no_sync) else contextlib.nullcontext()

    def _buckets(self, grads: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
        bucket: list[torch.Tensor] = []
        size = 0
        for g in grads:
            if bucket and (
                size + g.numel() * g.element_size() > self._bucket_bytes
                or g.dtype != bucket[0].dtype
            ):
                yield bucket
                bucket, size = [], 0
            bucket.append(g)
            size += g.numel() * g.element_size()
        if bucket:
            yield bucket

    def after_backward(self, model: nn.Module) -> None:
        world_size = get_world_size()
        if world_size == 1:
            return
        grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
        pending = []
        for bucket in self._buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            pending.append((dist.all_reduce(flat, async_op=True), flat, bucket))
        for work, flat, bucket in pending:
            work.wait()
            flat.div_(world_size)
            offset = 0
            for g in bucket:
                n = g.numel()
                g.copy_(flat[offset : offset + n].view_as(g))
                offset += n


def build_gradient_reducer(
    world_size: int,
    manual: bool,
    broadcast_buffers: bool = True,
    bucket_cap_mb: float = 25,
    find_unused_parameters: bool = False,
) -> NoReduction:
    """The reducer for this run: none (1 process), DDP, or manual all-reduce."""
    if world_size == 1:
        return NoReduction()
    if manual:
        return ManualReduction(bucket_cap_mb=bucket_cap_mb, broadcast_buffers=broadcast_buffers)
    return DDPReduction(broadcast_buffers, bucket_cap_mb, find_unused_parameters)

"""Gradient-reduction strategies, chosen once from config.

- :class:`NoReduction`: one process.
- :class:`DDPReduction`: ``DistributedDataParallel`` all-reduces gradients during backward.
- :class:`ManualReduction` (``DISTRIBUTED.MANUAL_GRADIENT_REDUCTION``, VISSL's mode for
  activation checkpointing): forward and backward run under DDP's ``no_sync``; before the
  forward, buffers are broadcast from rank 0 (what DDP does itself when it syncs); after
  backward, gradients are all-reduced in flat buckets (all launched asynchronously, then
  waited on) and averaged. Public torch APIs only.

The step calls ``with reducer.context(model): ...forward/backward...`` and then
``reducer.after_backward(model)``; it never checks which strategy it has.

Parameters stay identical on every rank because every rank applies the same averaged
gradient with the same optimizer; DDP's constructor broadcasts rank 0's parameters and
buffers once, at the start.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from vissl.utils.distributed import (
    all_reduce_max,
    broadcast_coalesced,
    get_world_size,
    iter_buckets,
    unflatten_into,
)

logger = logging.getLogger(__name__)

# torch >= 2.13 renamed DDP's ``broadcast_buffers`` to ``forward_sync_buffers``.
_DDP_BUFFER_KWARG = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else "broadcast_buffers"
)


def unwrap_compiled(model: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wrapped (``OptimizedModule._orig_mod``), else ``model``.

    ``MODEL.COMPILE`` wraps the (DDP) model after the reducer did; type checks on the
    model must look through that wrapper.
    """
    while True:
        inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module) or inner is model:
            return model
        model = inner


class NoReduction:
    """Nothing to reduce (a single process)."""

    name = "none"

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        """The model the step calls (here: ``model`` itself)."""
        return model

    def context(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Entered around forward, loss and backward of a training step."""
        return contextlib.nullcontext()

    def after_backward(self, model: nn.Module) -> None:
        """Called once after backward, before the optimizer step."""


class DDPReduction(NoReduction):
    """Wrap the model in DDP; DDP all-reduces gradients during backward.

    Args:
        broadcast_buffers: broadcast rank 0's buffers (BatchNorm statistics) before each
            forward (``DISTRIBUTED.BROADCAST_BUFFERS``).
        bucket_cap_mb: DDP bucket size (``DATA.DDP_BUCKET_CAP_MB``).
        find_unused_parameters: let DDP find parameters that get no gradient.
    """

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

    def _ddp(self, model: nn.Module, device: torch.device, find_unused: bool) -> nn.Module:
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise (e.g. feature extraction)
        kwargs: dict[str, Any] = {_DDP_BUFFER_KWARG: self.broadcast_buffers}
        return DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            output_device=device.index if device.type == "cuda" else None,
            bucket_cap_mb=self.bucket_cap_mb,
            find_unused_parameters=find_unused,
            **kwargs,
        )

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        return self._ddp(model, device, self.find_unused_parameters)


class ManualReduction(DDPReduction):
    """DDP's ``no_sync`` during forward/backward, then a bucketed async all-reduce.

    Gradients of parameters that got none on this rank are handled as DDP does with
    ``find_unused_parameters``: when ``find_unused_parameters`` is set, the ranks first
    agree (one small all-reduce) on which parameters have a gradient anywhere; those
    missing here are taken as zero and the globally unused ones keep ``grad=None``.
    Without it, every rank must produce gradients for the same parameters (as DDP
    requires without ``find_unused_parameters``).
    """

    name = "manual"

    def __init__(
        self,
        bucket_cap_mb: float = 25,
        broadcast_buffers: bool = True,
        find_unused_parameters: bool = False,
    ) -> None:
        super().__init__(broadcast_buffers, bucket_cap_mb, find_unused_parameters)
        self._bucket_bytes = max(1, int(bucket_cap_mb * 1024 * 1024))

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        # DDP never reduces here (always under no_sync), so it needs no unused-parameter
        # search; the constructor still broadcasts rank 0's parameters and buffers.
        return self._ddp(model, device, find_unused=False)

    @contextlib.contextmanager
    def _context(self, model: nn.Module) -> Iterator[None]:
        model = unwrap_compiled(model)
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        if self.broadcast_buffers:
            # Under no_sync DDP stops syncing buffers before forward; do it here.
            broadcast_coalesced(list(model.module.buffers()), src=0)
        with model.no_sync():
            yield

    def context(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """DDP's ``no_sync`` (also through a ``torch.compile`` wrapper) and buffer broadcast."""
        return self._context(model)

    def _params_to_reduce(self, model: nn.Module) -> list[nn.Parameter]:
        params = [p for p in model.parameters() if p.requires_grad]
        if not self.find_unused_parameters:
            return [p for p in params if p.grad is not None]
        device = params[0].device if params and dist.get_backend() == "nccl" else None
        has_grad = torch.tensor(
            [p.grad is not None for p in params], dtype=torch.int32, device=device
        )
        all_reduce_max(has_grad)
        used = [p for p, flag in zip(params, has_grad.tolist(), strict=True) if flag]
        for p in used:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return used

    def after_backward(self, model: nn.Module) -> None:
        world_size = get_world_size()
        if world_size == 1:
            return
        params = self._params_to_reduce(model)
        grads = [p.grad for p in params if p.grad is not None]
        if any(g.is_sparse for g in grads):
            raise NotImplementedError(
                "config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION does not support sparse "
                "gradients; set it to False to let DDP reduce them."
            )
        pending = []
        for bucket in iter_buckets(grads, self._bucket_bytes):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            pending.append((dist.all_reduce(flat, async_op=True), flat, bucket))
        for work, flat, bucket in pending:
            work.wait()
            flat.div_(world_size)
            unflatten_into(flat, bucket)


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
        return ManualReduction(
            bucket_cap_mb=bucket_cap_mb,
            broadcast_buffers=broadcast_buffers,
            find_unused_parameters=find_unused_parameters,
        )
    return DDPReduction(broadcast_buffers, bucket_cap_mb, find_unused_parameters)


def needs_find_unused_parameters(config: Any) -> bool:
    """Whether the model may leave trainable parameters without a gradient.

    True for VISSL's feature-extraction evaluation models (several heads on trunk
    features; see :func:`vissl.models.model_helpers.is_feature_extractor_model`).
    """
    from vissl.models.model_helpers import is_feature_extractor_model

    return bool(is_feature_extractor_model(config.MODEL))


def build_gradient_reducer_from_config(config: Any, world_size: int | None = None) -> NoReduction:
    """:func:`build_gradient_reducer` with every setting read from the config.

    Reads ``DISTRIBUTED.MANUAL_GRADIENT_REDUCTION``, ``DISTRIBUTED.BROADCAST_BUFFERS``,
    ``DATA.DDP_BUCKET_CAP_MB`` and the model config (find unused parameters).
    """
    world_size = get_world_size() if world_size is None else world_size
    reducer = build_gradient_reducer(
        world_size,
        manual=bool(config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION),
        broadcast_buffers=bool(config.DISTRIBUTED.BROADCAST_BUFFERS),
        bucket_cap_mb=float(config.DATA.DDP_BUCKET_CAP_MB),
        find_unused_parameters=needs_find_unused_parameters(config),
    )
    if world_size > 1:
        logger.info(
            "gradient reduction: %s (find unused parameters: %s)",
            reducer.name,
            getattr(reducer, "find_unused_parameters", False),
        )
    return reducer

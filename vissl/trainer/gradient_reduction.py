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

from vissl.errors import VisslError
from vissl.utils.distributed import (
    broadcast_coalesced,
    get_world_size,
    gloo_group,
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

    def _ddp(
        self,
        model: nn.Module,
        device: torch.device,
        find_unused: bool,
        gradient_as_bucket_view: bool = True,
    ) -> nn.Module:
        if not any(p.requires_grad for p in model.parameters()):
            return model  # nothing to synchronise (e.g. feature extraction)
        kwargs: dict[str, Any] = {
            _DDP_BUFFER_KWARG: self.broadcast_buffers,
            # gradients are views into DDP's buckets: no copy in and out of them
            "gradient_as_bucket_view": gradient_as_bucket_view,
        }
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


class UnusedParametersError(VisslError, RuntimeError):
    """A trainable parameter got no gradient on a rank, under manual gradient reduction."""


class ManualReduction(DDPReduction):
    """DDP's ``no_sync`` during forward/backward, then a bucketed async all-reduce.

    - Buffers (BatchNorm statistics) are broadcast from rank 0 once per optimizer step,
      before its first forward, in one collective per (device, dtype) bucket.
    - Gradients are all-reduced in flat buckets of one (device, dtype), all launched
      asynchronously, then waited on, and averaged. Nothing is read back to the host.
    - Parameters without a gradient: with ``find_unused_parameters``, the ranks agree on
      which parameters have a gradient anywhere, on host flags over a gloo group (no
      device read); those missing here are taken as zero and the globally unused ones
      keep ``grad=None``, as DDP does. Without it, every trainable parameter must have a
      gradient on every rank, as DDP requires: a parameter without one raises
      :class:`UnusedParametersError` at once (ranks that disagree would all-reduce
      buffers of different sizes, a hang or garbage under NCCL).
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
        self._buffers_synced = False  # this optimizer step's buffers were broadcast
        self._named: list[tuple[str, nn.Parameter]] | None = None
        # the wrapped model's buffers (listed once, not by a module walk every step)
        self._buffers: tuple[nn.Module, list[torch.Tensor]] | None = None

    def wrap(self, model: nn.Module, device: torch.device) -> nn.Module:
        # DDP never reduces here (always under no_sync), so it needs no unused-parameter
        # search; the constructor still broadcasts rank 0's parameters and buffers.
        self._buffers_synced = False
        self._named = None
        self._buffers = None
        # (DDP's buckets are never reduced here: plain gradients)
        return self._ddp(model, device, find_unused=False, gradient_as_bucket_view=False)

    @contextlib.contextmanager
    def _context(self, model: nn.Module) -> Iterator[None]:
        model = unwrap_compiled(model)
        if not isinstance(model, DistributedDataParallel):
            yield
            return
        if self.broadcast_buffers and not self._buffers_synced:
            # Under no_sync DDP stops syncing buffers before forward; do it here, once per
            # optimizer step (not at every micro-batch of an accumulated step).
            cached = self._buffers
            if cached is None or cached[0] is not model.module:
                cached = self._buffers = (model.module, list(model.module.buffers()))
            broadcast_coalesced(cached[1], src=0)
            self._buffers_synced = True
        with model.no_sync():
            yield

    def context(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """DDP's ``no_sync`` (also through a ``torch.compile`` wrapper) and buffer broadcast."""
        return self._context(model)

    def _named_trainable(self, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """The trainable parameters, by name (named once; trainable as of this step)."""
        if self._named is None:
            inner = unwrap_compiled(model)
            inner = inner.module if isinstance(inner, DistributedDataParallel) else inner
            self._named = list(inner.named_parameters())
        return [(n, p) for n, p in self._named if p.requires_grad]

    def _params_to_reduce(self, model: nn.Module) -> list[nn.Parameter]:
        named = self._named_trainable(model)
        if not self.find_unused_parameters:
            missing = [n for n, p in named if p.grad is None]
            if missing:
                raise UnusedParametersError(
                    f"config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION: {len(missing)} trainable "
                    f"parameters got no gradient on rank {dist.get_rank()} in this step, e.g. "
                    f"{missing[:5]}. Every rank must compute a gradient for every trainable "
                    "parameter (as DDP requires without find_unused_parameters): ranks that "
                    "disagree would all-reduce buffers of different sizes. Make the loss use "
                    "these parameters, or freeze them (requires_grad=False, e.g. "
                    "config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP for a while), or set "
                    "config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION=False."
                )
            return [p for _, p in named]
        # Host flags, agreed on a gloo group: no device tensor, no device read.
        has_grad = torch.tensor([p.grad is not None for _, p in named], dtype=torch.uint8)
        dist.all_reduce(has_grad, op=dist.ReduceOp.MAX, group=gloo_group())
        used = [p for (_, p), flag in zip(named, has_grad.tolist(), strict=True) if flag]
        for p in used:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        return used

    def after_backward(self, model: nn.Module) -> None:
        self._buffers_synced = False  # the next step's first forward broadcasts again
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

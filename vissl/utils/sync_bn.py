"""``MODEL.SYNC_BN_CONFIG``: BatchNorm statistics synchronised across processes.

- One process: a no-op.
- CUDA: torch's :class:`torch.nn.SyncBatchNorm` (``SYNC_BN_TYPE: apex`` is mapped to it,
  with a warning: apex is not used).
- CPU with several processes: :class:`CpuSyncBatchNorm`, the same computation over any
  backend (gloo): per-channel sums, sums of squares and counts are all-reduced in one
  differentiable collective per layer, in float64.

``GROUP_SIZE`` (as in VISSL): ``0`` syncs over all processes, ``-1`` over the processes of
one node (``NUM_PROC_PER_NODE``), ``N > 0`` over consecutive groups of ``N`` ranks.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from vissl.errors import ConfigError
from vissl.utils.distributed import all_reduce_sum_with_grad, get_rank, get_world_size

logger = logging.getLogger(__name__)

_KEY = "config.MODEL.SYNC_BN_CONFIG"
SYNC_BN_TYPES = ("pytorch", "apex")


class CpuSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose batch statistics span the processes of a group, over any backend.

    In training mode with several processes in its group, the batch statistics are those
    of the union of the processes' batches, and gradients flow through them exactly as in
    one process with the whole batch. Otherwise (evaluation, one process) it is plain
    BatchNorm. Not a subclass of ``nn.SyncBatchNorm``: DDP refuses those on CPU modules.

    Args:
        num_features, eps, momentum, affine, track_running_stats: as ``nn.BatchNorm2d``.
        process_group: the group to synchronise over (None: all processes).
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        group = self.process_group
        if (
            not (self.training or not self.track_running_stats)
            or not (dist.is_available() and dist.is_initialized())
            or dist.get_world_size(group) == 1
        ):
            return super().forward(input)
        return self._forward_synced(input, group)

    def _forward_synced(self, x: torch.Tensor, group: Any) -> torch.Tensor:
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked)
        channels = x.shape[1]
        dims = [0, *range(2, x.dim())]
        xd = x.double()
        count = torch.full((1,), x.numel() // max(channels, 1), dtype=torch.float64)
        stats = torch.cat([xd.sum(dims), (xd * xd).sum(dims), count.to(x.device)])
        stats = all_reduce_sum_with_grad(stats, group)
        total = stats[-1]
        mean = stats[:channels] / total
        var = (stats[channels : 2 * channels] / total - mean * mean).clamp_min(0)
        if total.item() <= 1:
            raise ValueError(
                f"expected more than 1 value per channel when training, got input size {x.shape} "
                "over all processes"
            )
        if self.training and self.track_running_stats:
            assert self.running_mean is not None and self.running_var is not None
            with torch.no_grad():
                unbiased = var * total / (total - 1)
                self.running_mean.mul_(1 - momentum).add_(
                    mean.to(self.running_mean), alpha=momentum
                )
                self.running_var.mul_(1 - momentum).add_(
                    unbiased.to(self.running_var), alpha=momentum
                )
        inv_std = torch.rsqrt(var + self.eps)
        scale = inv_std if self.weight is None else inv_std * self.weight.double()
        shift = -mean * scale if self.bias is None else self.bias.double() - mean * scale
        shape = [1, channels] + [1] * (x.dim() - 2)
        return x * scale.to(x.dtype).view(shape) + shift.to(x.dtype).view(shape)


class CpuSyncBatchNormAct(CpuSyncBatchNorm):
    """:class:`CpuSyncBatchNorm` that keeps the dropout and activation of a timm norm-act
    layer (``BatchNormAct2d``, in timm's EfficientNet and MobileNet models), which a plain
    conversion would drop. Same state-dict names as the layer it replaces."""

    def __init__(self, num_features: int, *args: Any, drop: nn.Module, act: nn.Module) -> None:
        super().__init__(num_features, *args)
        self.drop = drop
        self.act = act

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.act(self.drop(super().forward(input)))


def _is_norm_act(module: nn.Module) -> bool:
    """A BatchNorm with an activation inside (timm's ``BatchNormAct2d``)."""
    return isinstance(module, nn.modules.batchnorm._BatchNorm) and isinstance(
        getattr(module, "act", None), nn.Module
    )


def _group_size(config: Any, world_size: int) -> int:
    sync = config.MODEL.SYNC_BN_CONFIG
    group_size = int(sync.GROUP_SIZE)
    if group_size == 0:
        group_size = world_size
    elif group_size < 0:
        group_size = int(config.DISTRIBUTED.NUM_PROC_PER_NODE)
    if group_size > world_size or world_size % group_size != 0:
        raise ConfigError(
            f"{_KEY}.GROUP_SIZE={int(sync.GROUP_SIZE)} gives groups of {group_size} processes, "
            f"which do not divide the {world_size} processes of this run. Use 0 (all "
            "processes), -1 (the processes of one node) or a divisor of the world size.",
            f"{_KEY}.GROUP_SIZE",
        )
    return group_size


def _process_group(group_size: int, world_size: int) -> Any:
    if group_size == world_size:
        return None
    ranks = list(range(world_size))
    # Every rank must create every group, in the same order.
    groups = [dist.new_group(ranks[i : i + group_size]) for i in range(0, world_size, group_size)]
    return groups[get_rank() // group_size]


def convert_sync_batchnorm(model: nn.Module, config: Any, device: torch.device) -> nn.Module:
    """Apply ``MODEL.SYNC_BN_CONFIG`` to ``model`` (before it is wrapped by DDP).

    Args:
        model: the model, with ``nn.BatchNorm*`` layers.
        config: the full ``config`` section.
        device: the device this process trains on.

    Returns:
        ``model`` with its BatchNorm layers converted (the same object where possible).

    Raises:
        ConfigError: an unknown ``SYNC_BN_TYPE``, or a ``GROUP_SIZE`` that does not
            divide the number of processes.
    """
    sync = config.MODEL.SYNC_BN_CONFIG
    if not sync.CONVERT_BN_TO_SYNC_BN:
        return model
    sync_type = str(sync.SYNC_BN_TYPE)
    if sync_type not in SYNC_BN_TYPES:
        raise ConfigError(
            f"{_KEY}.SYNC_BN_TYPE={sync_type!r} is not one of {list(SYNC_BN_TYPES)}.",
            f"{_KEY}.SYNC_BN_TYPE",
        )
    world_size = get_world_size()
    if world_size == 1:
        logger.info("%s.CONVERT_BN_TO_SYNC_BN: one process, BatchNorm is left as is", _KEY)
        return model
    if sync_type == "apex":
        logger.warning(
            "%s.SYNC_BN_TYPE=apex: apex is not used; torch's SyncBatchNorm does the same", _KEY
        )
    group_size = _group_size(config, world_size)
    process_group = _process_group(group_size, world_size)
    if device.type == "cuda" and any(_is_norm_act(m) for m in model.modules()):
        # timm's converter keeps the activation of its norm-act layers (torch's drops it)
        from timm.layers import convert_sync_batchnorm as timm_convert_sync_batchnorm

        converted = timm_convert_sync_batchnorm(model, process_group=process_group)
        impl = "torch.nn.SyncBatchNorm (timm's norm-act layers: timm's SyncBatchNormAct)"
    elif device.type == "cuda":
        converted = nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=process_group)
        impl = "torch.nn.SyncBatchNorm"
    else:
        converted = _convert(model, process_group)
        impl = "CpuSyncBatchNorm"
    logger.info("BatchNorm synchronised over groups of %d processes (%s)", group_size, impl)
    return converted


def _convert(module: nn.Module, process_group: Any) -> nn.Module:
    """Replace every ``nn.BatchNorm{1,2,3}d`` of ``module`` by :class:`CpuSyncBatchNorm`."""
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, nn.SyncBatchNorm | CpuSyncBatchNorm
    ):
        args = (
            module.eps,
            module.momentum,
            module.affine,
            module.track_running_stats,
            process_group,
        )
        new: CpuSyncBatchNorm
        if _is_norm_act(module):
            drop = getattr(module, "drop", None)
            new = CpuSyncBatchNormAct(
                module.num_features,
                *args,
                drop=drop if isinstance(drop, nn.Module) else nn.Identity(),
                act=module.act,  # type: ignore[arg-type]
            )
        else:
            new = CpuSyncBatchNorm(module.num_features, *args)
        if module.affine:
            with torch.no_grad():
                new.weight = module.weight
                new.bias = module.bias
        new.running_mean = module.running_mean
        new.running_var = module.running_var
        new.num_batches_tracked = module.num_batches_tracked
        new.train(module.training)
        if hasattr(module, "qconfig"):
            new.qconfig = module.qconfig
        return new
    for name, child in module.named_children():
        new_child = _convert(child, process_group)
        if new_child is not child:
            setattr(module, name, new_child)
    return module


__all__ = ["CpuSyncBatchNorm", "CpuSyncBatchNormAct", "convert_sync_batchnorm"]

"""Small torch.distributed helpers that also work without a process group (world size 1)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def is_primary() -> bool:
    return get_rank() == 0


def barrier() -> None:
    if is_distributed() and get_world_size() > 1:
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks, in place; returns it."""
    if is_distributed() and get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Average ``tensor`` over ranks, in place; returns it."""
    world_size = get_world_size()
    if world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor.div_(world_size)
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """Elementwise maximum of ``tensor`` over ranks, in place; returns it."""
    if is_distributed() and get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward sends each rank the gradient of its own slice.

    The gradient of the gathered tensor is summed over ranks first, since every rank's
    loss depends on every slice.
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        output = [torch.zeros_like(tensor) for _ in range(get_world_size())]
        dist.all_gather(output, tensor.contiguous())
        return tuple(output)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        all_grads = torch.stack(grads)
        dist.all_reduce(all_grads, op=dist.ReduceOp.SUM)
        return all_grads[get_rank()]


def gather_from_all(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every rank along dim 0, keeping gradients.

    With one process it returns ``tensor`` itself.
    """
    if get_world_size() == 1:
        return tensor
    return torch.cat(_GatherWithGrad.apply(tensor), dim=0)


def broadcast_object(obj: object, src: int = 0) -> object:
    if get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]

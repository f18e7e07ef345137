"""Small torch.distributed helpers that also work without a process group (world size 1)."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from vissl.errors import DistributedSetupError


def find_free_port() -> int:
    """A TCP port on localhost that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def all_gather_object(obj: object) -> list[object]:
    """``obj`` from every rank, in rank order (a one-element list with one process)."""
    if get_world_size() == 1:
        return [obj]
    out: list[object] = [None] * get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_object_to_primary(obj: object) -> list[object] | None:
    """``obj`` of every rank, in rank order, on rank 0; None on the other ranks.

    Over the gloo group (:func:`gloo_group`): host objects never travel through device
    memory, and only rank 0 receives them.
    """
    if get_world_size() == 1:
        return [obj]
    out: list[object] | None = [None] * get_world_size() if get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0, group=gloo_group())
    return out


def broadcast_object(obj: object, src: int = 0) -> object:
    """Rank ``src``'s ``obj`` on every rank (``obj`` itself with one process).

    Over the gloo group (:func:`gloo_group`), as host objects should travel.
    """
    if get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=gloo_group())
    return box[0]


class _AllReduceSumWithGrad(torch.autograd.Function):
    """all_reduce(SUM) whose backward all-reduces the incoming gradient (also a SUM).

    Every rank's output depends on every rank's input, so the gradient of one rank's
    input is the sum over ranks of the gradients of the output.
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        out = tensor.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


def all_reduce_sum_with_grad(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum ``tensor`` over the ranks of ``group`` (default: all), differentiably.

    Returns a new tensor; with one process, ``tensor`` itself.
    """
    if not is_distributed() or dist.get_world_size(group) == 1:
        return tensor
    return _AllReduceSumWithGrad.apply(tensor, group)  # type: ignore[no-any-return]


def iter_buckets(
    tensors: Sequence[torch.Tensor], bucket_bytes: int
) -> Iterator[list[torch.Tensor]]:
    """Split ``tensors`` into buckets of one dtype and device, each at most
    ``bucket_bytes`` (a single larger tensor gets a bucket of its own).

    Tensors are grouped by (device, dtype) first, in order of first appearance, keeping
    their order within a group: interleaved dtypes (BatchNorm's float statistics and
    integer counters) do not start a new bucket at every change.
    """
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    for group in groups.values():
        bucket: list[torch.Tensor] = []
        size = 0
        for t in group:
            nbytes = t.numel() * t.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append(t)
            size += nbytes
        if bucket:
            yield bucket


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of the 1-D ``flat`` back into ``tensors``, in place."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def broadcast_coalesced(
    tensors: Sequence[torch.Tensor], src: int = 0, bucket_bytes: int = 25 * 1024 * 1024
) -> None:
    """Broadcast ``tensors`` in place from rank ``src``, one flat copy per bucket.

    With one process it does nothing.
    """
    if get_world_size() == 1:
        return
    for bucket in iter_buckets(tensors, bucket_bytes):
        flat = torch.cat([t.detach().reshape(-1) for t in bucket])
        dist.broadcast(flat, src=src)
        unflatten_into(flat, bucket)


_GLOO_SIDE_GROUP: tuple[int, Any] | None = None


def gloo_group() -> Any:
    """A process group of every rank on the gloo backend, for agreements on host values.

    The default group itself when it is gloo; otherwise one gloo group beside it
    (NCCL's collectives need device tensors), created at the first call and shared by
    later ones. Collective at the first call: every rank must make it at the same point.

    Raises:
        DistributedSetupError: gloo could not connect the ranks (``GLOO_SOCKET_IFNAME``).
    """
    global _GLOO_SIDE_GROUP
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    world = id(dist.group.WORLD)
    if _GLOO_SIDE_GROUP is not None and _GLOO_SIDE_GROUP[0] == world:
        return _GLOO_SIDE_GROUP[1]
    try:
        group = dist.new_group(backend="gloo")
    except Exception as err:
        raise DistributedSetupError(
            "could not create the gloo process group the ranks use to agree on host-side "
            f"decisions (stopping on preemption or Ctrl-C, unused parameters) beside NCCL: "
            f"{err}. Gloo uses the network interface named by GLOO_SOCKET_IFNAME (by default "
            "the one this host's name resolves to); set GLOO_SOCKET_IFNAME to an interface "
            "every node can reach, e.g. GLOO_SOCKET_IFNAME=eth0 (the one NCCL_SOCKET_IFNAME "
            "names)."
        ) from err
    _GLOO_SIDE_GROUP = (world, group)
    return group


def max_parameter_divergence(module: torch.nn.Module) -> float:
    """Largest absolute difference between this rank's parameters and rank 0's.

    Collective (every rank must call it); 0.0 with one process. For tests and debugging:
    data-parallel replicas must stay identical.
    """
    if get_world_size() == 1:
        return 0.0
    params = [p.detach() for p in module.parameters()]
    if not params:
        return 0.0
    # nccl needs device tensors; gloo takes CPU tensors.
    device = params[0].device if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.cat([p.reshape(-1).float().to(device) for p in params])
    ref = mine.clone()
    dist.broadcast(ref, src=0)
    diff = (mine - ref).abs().max().reshape(1)
    all_reduce_max(diff)
    return float(diff.item())

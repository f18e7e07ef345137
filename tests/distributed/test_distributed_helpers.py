"""vissl.utils.distributed helpers on 2 gloo processes: gradients through collectives."""

from __future__ import annotations

from typing import Any

import torch

from vissl.utils.distributed import (
    all_reduce_sum_with_grad,
    broadcast_coalesced,
    gather_from_all,
    iter_buckets,
    max_parameter_divergence,
)
from vissl.utils.test_utils import spawn_gloo


def _gather(rank: int, world_size: int) -> Any:
    x = torch.full((2, 3), float(rank + 1), requires_grad=True)
    gathered = gather_from_all(x)
    weights = torch.arange(12.0).reshape(4, 3) * (rank + 1)  # a different loss per rank
    (gathered * weights).sum().backward()
    summed = all_reduce_sum_with_grad(x * 2)
    y = torch.ones(3, requires_grad=True)
    (all_reduce_sum_with_grad(y * (rank + 1)) ** 2).sum().backward()
    return gathered.detach(), x.grad, summed.detach(), y.grad


def test_gather_and_all_reduce_keep_gradients():
    (g0, gx0, s0, gy0), (g1, gx1, s1, gy1) = spawn_gloo(_gather, 2)
    expected = torch.cat([torch.full((2, 3), 1.0), torch.full((2, 3), 2.0)])
    assert torch.equal(g0, expected) and torch.equal(g1, expected)
    # The gradient of rank r's slice is the sum over ranks of their losses' gradients.
    w = torch.arange(12.0).reshape(4, 3)
    total = w * 1 + w * 2
    assert torch.equal(gx0, total[:2]) and torch.equal(gx1, total[2:])
    assert torch.equal(s0, torch.full((2, 3), 6.0)) and torch.equal(s1, s0)
    # sum_r (y * (r+1)) = 3y, loss_r = (3y)^2 summed: d/dy over both ranks' losses.
    # rank r's y contributes (r+1) * sum_r' 2 * 3y = (r+1) * 12.
    assert torch.equal(gy0, torch.full((3,), 12.0)) and torch.equal(gy1, torch.full((3,), 24.0))


def _broadcast(rank: int, world_size: int) -> Any:
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(float(rank))
    before = max_parameter_divergence(module)
    tensors = [*module.parameters(), *module.buffers()]
    broadcast_coalesced(tensors, src=0, bucket_bytes=8)
    return before, max_parameter_divergence(module), module.state_dict()


def test_broadcast_coalesced_syncs_every_dtype_and_divergence_is_measured():
    (b0, a0, s0), (b1, a1, s1) = spawn_gloo(_broadcast, 2)
    assert b0 == b1 == 1.0
    assert a0 == a1 == 0.0
    for k in s0:
        assert torch.equal(s0[k], s1[k]), k


def test_iter_buckets_splits_by_size_and_dtype():
    ts = [torch.zeros(4), torch.zeros(4), torch.zeros(4, dtype=torch.float64), torch.zeros(100)]
    sizes = [[t.numel() for t in b] for b in iter_buckets(ts, bucket_bytes=32)]
    assert sizes == [[4, 4], [100], [4]]  # grouped by dtype, then by size


def test_interleaved_dtypes_share_buckets():
    """#22 item 9: BatchNorm buffers alternate float statistics and int64 counters; a new
    bucket at every dtype change made ~106 broadcasts per forward for ResNet-50."""
    from torchvision.models import resnet50

    buffers = list(resnet50().buffers())
    assert len(buffers) == 159
    buckets = list(iter_buckets(buffers, bucket_bytes=25 * 1024 * 1024))
    assert len(buckets) == 2  # one float32, one int64
    assert sum(len(b) for b in buckets) == len(buffers)


def _gather_to_primary(rank: int, world_size: int):
    from vissl.utils.distributed import gather_object_to_primary

    return gather_object_to_primary({"rank": rank, "t": torch.full((2,), float(rank))})


def test_gather_object_to_primary_only_rank_0_receives():
    """#22 item 12: per-rank checkpoint state is gathered on the writing rank only."""
    r0, r1 = spawn_gloo(_gather_to_primary, 2)
    assert r1 is None
    assert [d["rank"] for d in r0] == [0, 1] and torch.equal(r0[1]["t"], torch.ones(2))

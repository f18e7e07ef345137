"""SimCLR NT-Xent loss: a naive reference, 1 vs 2 processes, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses import build_loss
from vissl.losses.simclr_info_nce_loss import SimclrInfoNCELoss, simclr_masks
from vissl.utils.test_utils import spawn_gloo

TEMPERATURE = 0.1


def naive_nt_xent(per_rank: list[torch.Tensor], rank: int, temperature: float) -> float:
    """NT-Xent of ``rank``'s rows written with loops, from the formula.

    Every rank's rows are ``[view0 of its B samples; view1 of its B samples]``. A row's
    positive is the other view of its sample; its negatives are all other rows of all
    ranks except itself and that positive.
    """
    rows = []  # (rank, view, sample, vector)
    for r, emb in enumerate(per_rank):
        b = emb.shape[0] // 2
        for j in range(emb.shape[0]):
            v = emb[j].double()
            rows.append((r, j // b, j % b, v / v.norm()))
    total = 0.0
    count = 0
    for r, view, sample, anchor in rows:
        if r != rank:
            continue
        pos = 0.0
        neg = 0.0
        for r2, view2, sample2, other in rows:
            same_sample = r2 == r and sample2 == sample
            if same_sample and view2 == view:
                continue  # the anchor itself
            sim = math.exp(float(anchor @ other) / temperature)
            if same_sample:
                pos += sim
            else:
                neg += sim
        total += -math.log(pos / (pos + neg))
        count += 1
    return total / count


def _loss(temperature: float = TEMPERATURE, dim: int = 8) -> SimclrInfoNCELoss:
    cfg = AttrDict(
        name="simclr_info_nce_loss",
        simclr_info_nce_loss={
            "temperature": temperature,
            "buffer_params": {"embedding_dim": dim, "world_size": 64, "effective_batch_size": 4096},
        },
    )
    loss = build_loss(cfg)
    assert isinstance(loss, SimclrInfoNCELoss)
    return loss


def test_single_process_matches_naive_formula() -> None:
    torch.manual_seed(0)
    emb = torch.randn(10, 8)  # B = 5 samples, 2 views
    got = _loss()(emb, None)
    assert got.item() == pytest.approx(naive_nt_xent([emb], 0, TEMPERATURE), rel=1e-5)


def test_small_temperature_does_not_overflow() -> None:
    torch.manual_seed(1)
    emb = torch.randn(6, 8)
    got = _loss(temperature=0.005)(emb, None)
    assert torch.isfinite(got)
    assert got.item() == pytest.approx(naive_nt_xent([emb], 0, 0.005), rel=1e-4)


def test_list_output_and_identical_views() -> None:
    torch.manual_seed(2)
    x = torch.randn(4, 8)
    emb = torch.cat([x, x])  # both views identical: positives are the best match
    loss = _loss()
    assert loss([emb], None).item() == pytest.approx(naive_nt_xent([emb], 0, TEMPERATURE), abs=1e-5)


def test_masks_layout() -> None:
    pos, keep = simclr_masks(local_batch=4, world_size=2, rank=1)
    # rank 1 rows are global columns 4..7; row 0 (view0, sample0) <-> column 6 (view1, sample0)
    assert pos.shape == (4, 8)
    assert pos[0].nonzero().flatten().tolist() == [6]
    assert pos[3].nonzero().flatten().tolist() == [5]
    assert (~keep[0]).nonzero().flatten().tolist() == [4]
    assert int(pos.sum()) == 4 and int((~keep).sum()) == 4


def test_bad_inputs_raise() -> None:
    loss = _loss()
    with pytest.raises(ConfigError, match=r"buffer_params\.embedding_dim"):
        loss(torch.randn(4, 16), None)
    with pytest.raises(ValueError, match="views"):
        loss(torch.randn(5, 8), None)
    with pytest.raises(ConfigError, match=r"simclr_info_nce_loss\.temperature"):
        SimclrInfoNCELoss(temperature=0)


def _rank_embeddings(world_size: int, b: int, dim: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randn(2 * b, dim, generator=gen) for _ in range(world_size)]


def _distributed_worker(rank: int, world_size: int, b: int, dim: int) -> tuple[float, list]:
    torch.manual_seed(0)
    per_rank = _rank_embeddings(world_size, b, dim)
    emb = per_rank[rank].clone().requires_grad_(True)
    loss = _loss(dim=dim)(emb, None)
    loss.backward()
    return loss.item(), emb.grad.tolist()


def test_two_processes_match_one_process_on_the_concatenated_batch() -> None:
    world_size, b, dim = 2, 3, 8
    results = spawn_gloo(_distributed_worker, world_size, b, dim)
    per_rank = _rank_embeddings(world_size, b, dim)

    # Every rank's loss is the naive formula over the gathered rows.
    for rank, (loss_value, _) in enumerate(results):
        assert loss_value == pytest.approx(naive_nt_xent(per_rank, rank, TEMPERATURE), rel=1e-5)

    # One process on the concatenated batch, re-laid out view-major over all 2*b samples.
    view0 = torch.cat([e[:b] for e in per_rank])
    view1 = torch.cat([e[b:] for e in per_rank])
    single_in = torch.cat([view0, view1]).requires_grad_(True)
    single = _loss(dim=dim)(single_in, None)
    single.backward()
    mean_of_ranks = sum(r[0] for r in results) / world_size
    assert mean_of_ranks == pytest.approx(single.item(), rel=1e-5)

    # Gradients flow through the gather: each rank gets d(sum_r loss_r)/d(its rows),
    # which is world_size * d(single)/d(those rows).
    grad = single_in.grad
    n = world_size * b
    for rank, (_, rank_grad) in enumerate(results):
        expected = torch.cat(
            [grad[rank * b : (rank + 1) * b], grad[n + rank * b : n + (rank + 1) * b]]
        )
        assert torch.allclose(torch.tensor(rank_grad), world_size * expected, atol=1e-5)
        assert torch.tensor(rank_grad).abs().sum() > 0

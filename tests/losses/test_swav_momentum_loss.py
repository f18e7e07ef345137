"""swav_momentum_loss: codes from the momentum encoder's scores (formula written here),
its EMA hook, eval mode, queue of momentum embeddings, normalised prototypes."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.hooks.swav_hooks import NormalizePrototypesHook, SwAVMomentumHook
from vissl.losses.swav_momentum_loss import SwAVMomentumLoss
from vissl.models.heads.swav_head import SwAVHead

T, EPS, ITERS = 0.1, 0.05, 3


def ref_codes(scores: torch.Tensor) -> torch.Tensor:
    """Sinkhorn-Knopp of the paper: Q = exp(S^T/eps) scaled to 1, rows to 1/K, columns to
    1/B, alternately; times B."""
    q = torch.exp(scores.detach().double() / EPS).t().clone()
    k, b = q.shape
    q /= q.sum()
    for _ in range(ITERS):
        for j in range(k):
            q[j] = q[j] / q[j].sum() / k
        for i in range(b):
            q[:, i] = q[:, i] / q[:, i].sum() / b
    return (q * b).t()


def ref_loss(scores: torch.Tensor, m_scores: torch.Tensor, crops: int, assign: list[int]) -> float:
    """``m_scores``: the momentum encoder's scores of the assign crops, crop ``assign[j]``
    in block ``j``."""
    b = scores.shape[0] // crops
    total = 0.0
    for j, c in enumerate(assign):
        q = ref_codes(m_scores[j * b : (j + 1) * b])
        term = 0.0
        for p in range(crops):
            if p == c:
                continue
            for i in range(b):
                row = scores[p * b + i].detach().double() / T
                log_p = row - math.log(float(torch.exp(row).sum()))
                term -= float((q[i] * log_p).sum()) / b
        total += term / (crops - 1)
    return total / len(assign)


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(6, 8)
        self.heads = nn.ModuleList([SwAVHead({}, dims=[8, 4], num_clusters=[5])])

    def forward(self, x: torch.Tensor) -> list[Any]:
        return [self.heads[0](self.trunk(x))]


def make_loss(**kw: Any) -> SwAVMomentumLoss:
    args: dict[str, Any] = dict(
        temperature=T,
        epsilon=EPS,
        num_iters=ITERS,
        num_crops=3,
        crops_for_assign=[0, 1],
        num_prototypes=[5],
        embedding_dim=4,
        momentum=0.9,
    )
    args.update(kw)
    return SwAVMomentumLoss(**args)


def test_codes_come_from_the_momentum_scores() -> None:
    torch.manual_seed(0)
    loss = make_loss()
    model = TinyModel()
    loss.bind_model(model)
    assert all(not p.requires_grad for p in loss.momentum_encoder.parameters())
    assert any(k.startswith("momentum_encoder.") for k in loss.state_dict())
    scores, m_scores = torch.randn(12, 5), torch.randn(8, 5)  # 3 crops, 2 assign crops
    loss.momentum_output = [torch.randn(8, 4), m_scores]
    got = loss([torch.randn(12, 4), scores]).item()
    assert got == pytest.approx(ref_loss(scores, m_scores, 3, [0, 1]), rel=1e-5)
    assert loss.momentum_output is None  # used once
    with pytest.raises(RuntimeError, match="momentum encoder output"):
        loss([torch.randn(12, 4), scores])
    loss.momentum_output = [torch.randn(12, 4), torch.randn(12, 5)]  # every crop: refused
    with pytest.raises(ValueError, match="crops_for_assign crops"):
        loss([torch.randn(12, 4), scores])


def test_codes_pair_with_their_crops_when_the_assign_crops_are_not_the_first() -> None:
    """crops_for_assign=[2, 0]: the encoder's block 0 is crop 2, block 1 crop 0; the codes
    of crop 2 are predicted by crops 0, 1 and 3 (and the queue keeps block j for crop j)."""
    torch.manual_seed(3)
    loss = make_loss(num_crops=4, crops_for_assign=[2, 0])
    loss.bind_model(TinyModel())
    scores, m_scores = torch.randn(8, 5), torch.randn(4, 5)
    loss.momentum_output = [torch.randn(4, 4), m_scores]
    got = loss([torch.randn(8, 4), scores]).item()
    assert got == pytest.approx(ref_loss(scores, m_scores, 4, [2, 0]), rel=1e-5)
    swapped = torch.cat([m_scores[2:], m_scores[:2]])
    assert got != pytest.approx(ref_loss(scores, swapped, 4, [2, 0]), rel=1e-5)


def test_uniform_momentum_scores_give_ln_k() -> None:
    loss = make_loss()
    loss.bind_model(TinyModel())
    loss.momentum_output = [torch.randn(8, 4), torch.randn(8, 5)]
    assert loss([torch.randn(12, 4), torch.zeros(12, 5)]).item() == pytest.approx(math.log(5))


def _task(model: nn.Module, loss: SwAVMomentumLoss, x: torch.Tensor, iteration: int = 0):
    precision = SimpleNamespace(autocast=contextlib.nullcontext)
    return SimpleNamespace(
        base_model=model,
        loss=loss,
        iteration=iteration,
        train=True,
        precision=precision,
        last_batch=SimpleNamespace(sample={"input": x}),
    )


def test_hook_runs_the_encoder_and_follows_the_model_by_ema() -> None:
    torch.manual_seed(1)
    model = TinyModel()
    loss = make_loss(num_crops=2, momentum_eval_mode_iter_start=2)
    loss.bind_model(model)
    hook = SwAVMomentumHook()
    x = torch.randn(4, 6)
    hook.on_forward(_task(model, loss, x, iteration=0))
    assert loss.momentum_encoder.training  # before momentum_eval_mode_iter_start
    _, scores = loss.momentum_output
    assert torch.allclose(scores, model(x)[0][1])
    hook.on_forward(_task(model, loss, x, iteration=2))
    assert not loss.momentum_encoder.training

    before = {k: v.clone() for k, v in loss.momentum_encoder.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    hook.on_update(_task(model, loss, x))
    for name, p in loss.momentum_encoder.named_parameters():
        expected = 0.9 * before[name] + 0.1 * dict(model.named_parameters())[name]
        assert torch.allclose(p, expected, atol=1e-6)


def test_prototypes_normalised_in_both_models() -> None:
    model = TinyModel()
    loss = make_loss(num_crops=2)
    loss.bind_model(model)
    with torch.no_grad():
        model.heads[0].prototypes0.weight.mul_(3)
        loss.momentum_encoder.heads[0].prototypes0.weight.mul_(5)
    NormalizePrototypesHook().on_update(_task(model, loss, torch.zeros(1, 6)))
    for m in (model, loss.momentum_encoder):
        norms = m.heads[0].prototypes0.weight.norm(dim=1)
        assert torch.allclose(norms, torch.ones_like(norms))


def test_queue_holds_momentum_embeddings_scored_by_momentum_prototypes() -> None:
    torch.manual_seed(2)
    model = TinyModel()
    loss = make_loss(num_crops=2, crops_for_assign=[0], queue_length=2, local_queue_length=2)
    loss.bind_model(model)
    m_emb = torch.nn.functional.normalize(torch.randn(2, 4), dim=1)  # crop 0 of 2 samples
    loss.momentum_output = [m_emb, torch.randn(2, 5)]
    loss([torch.randn(4, 4), torch.randn(4, 5)])
    assert torch.equal(loss.queue.embeddings[0], m_emb)
    # full now: the queue's momentum scores join the codes' Sinkhorn
    scores, m_scores = torch.randn(4, 5), torch.randn(2, 5)
    loss.momentum_output = [torch.randn(2, 4), m_scores]
    got = loss([torch.randn(4, 4), scores]).item()
    w = loss.momentum_encoder.heads[0].prototypes0.weight.detach()
    q = ref_codes(torch.cat([m_scores, m_emb @ w.t()]))[:2]
    row = scores[2:].double() / T
    expected = -(q * torch.log_softmax(row, dim=1)).sum(1).mean().item()
    assert got == pytest.approx(expected, rel=1e-5)


def test_bad_momentum() -> None:
    with pytest.raises(ConfigError, match="momentum"):
        make_loss(momentum=1.5)

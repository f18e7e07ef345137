"""BYOL and SimSiam losses: the papers' formulas, the target network without the predictor,
the cosine momentum, the stop-gradient, the projections of the same forward, config checks."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses import build_loss
from vissl.losses.byol_loss import BYOLLoss
from vissl.losses.predictor_common import MomentumTargetHook, ProjectionCapture
from vissl.losses.simsiam_loss import SimSiamCollapseHook, SimSiamLoss
from vissl.models.momentum import momentum_copy
from vissl.utils.hydra_config import hydra_compose_and_validate


def naive_byol(p: torch.Tensor, z: torch.Tensor) -> float:
    """BYOL eq. 2 and its symmetrisation, with loops: ||p/|p| - z'/|z'| ||^2 per pair."""
    b = p.shape[0] // 2
    total = 0.0
    for i in range(b):
        for pred, targ in ((p[i], z[b + i]), (p[b + i], z[i])):
            pn = pred.double() / math.sqrt(float((pred.double() ** 2).sum()))
            zn = targ.double() / math.sqrt(float((targ.double() ** 2).sum()))
            total += float(((pn - zn) ** 2).sum())
    return total / b


def naive_simsiam(p: torch.Tensor, z: torch.Tensor) -> float:
    """SimSiam eq. 1-2 with loops: D(p1, z2)/2 + D(p2, z1)/2, D = -p.z / (|p| |z|)."""
    b = p.shape[0] // 2
    total = 0.0
    for i in range(b):
        for pred, proj in ((p[i], z[b + i]), (p[b + i], z[i])):
            pd, zd = pred.double(), proj.double()
            cos = float(pd @ zd) / math.sqrt(float(pd @ pd) * float(zd @ zd))
            total += -cos / 2
    return total / b


def test_byol_matches_the_formula() -> None:
    torch.manual_seed(0)
    loss = BYOLLoss(embedding_dim=8)
    p, z = torch.randn(10, 8), torch.randn(10, 8)
    assert loss(p, teacher_output=z).item() == pytest.approx(naive_byol(p, z), rel=1e-5)


def test_byol_gradient_reaches_the_predictions_only() -> None:
    torch.manual_seed(1)
    loss = BYOLLoss(embedding_dim=8)
    p = torch.randn(6, 8, requires_grad=True)
    z = torch.randn(6, 8, requires_grad=True)
    loss([p], teacher_output=z).backward()
    assert p.grad is not None and p.grad.abs().sum() > 0
    assert z.grad is None


def test_byol_without_target_output_says_how_to_pass_it() -> None:
    with pytest.raises(TypeError, match="teacher_output="):
        BYOLLoss(embedding_dim=8)(torch.randn(4, 8))


def test_simsiam_matches_the_formula_and_stops_the_gradient_of_the_projection() -> None:
    torch.manual_seed(2)
    loss = SimSiamLoss(embedding_dim=8)
    model = _TinyModel()
    loss.bind_model(model)
    x = torch.randn(12, 5)
    p = model(x)[0]
    z = loss.capture.value
    assert z is not None
    expected = naive_simsiam(p.detach(), z.detach())
    got = loss(p)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    # the gradient is that of D(p, stopgrad(z)): recompute with z detached by hand
    got.backward()
    grads = {n: q.grad.clone() for n, q in model.named_parameters()}
    model.zero_grad()
    p2 = model(x)[0]
    z2 = loss.capture.take("test").detach()
    b = 6
    cos = nn.functional.cosine_similarity
    ref = -(cos(p2[:b], z2[b:]).mean() + cos(p2[b:], z2[:b]).mean()) / 2
    ref.backward()
    for n, q in model.named_parameters():
        torch.testing.assert_close(grads[n], q.grad, rtol=1e-5, atol=1e-7)


class _TinyModel(nn.Module):
    """trunk + [projector, predictor] heads, chained, like the base model."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(5, 6)
        self.heads = nn.ModuleList(
            [nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8)), nn.Linear(8, 8)]
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = self.trunk(x)
        for head in self.heads:
            out = head(out)
        return [out]


def test_projection_capture_ignores_copies_of_the_model() -> None:
    model = _TinyModel()
    capture = ProjectionCapture(model)
    copy = momentum_copy(model)  # carries the pre-hook
    model(torch.randn(4, 5))
    mine = capture.value
    copy(torch.randn(4, 5))
    assert capture.value is mine
    assert capture.take("test") is mine
    with pytest.raises(RuntimeError, match="no projector output"):
        capture.take("test")


def test_byol_target_network_drops_the_predictor_and_follows_the_cosine_schedule() -> None:
    torch.manual_seed(3)
    model = _TinyModel()
    loss = BYOLLoss(momentum=0.9, embedding_dim=8)
    loss.bind_model(model)
    target = loss.target_network
    assert target is not None and len(target.heads) == 1
    assert all(not q.requires_grad for q in target.parameters())
    before = {n: q.clone() for n, q in target.named_parameters()}
    with torch.no_grad():
        for q in model.parameters():
            q.add_(1.0)
    hook = MomentumTargetHook(loss)
    task = AttrDict(iteration=5, max_iteration=20, base_model=model)
    hook.on_update(task)  # type: ignore[arg-type]
    m = 1 - (1 - 0.9) * (math.cos(math.pi * 5 / 20) + 1) / 2
    assert hook.last_momentum == pytest.approx(m)
    source = dict(model.named_parameters())
    for n, q in target.named_parameters():
        torch.testing.assert_close(q, m * before[n] + (1 - m) * source[n])
    # the target's output is the projection: the model's output before its predictor
    x = torch.randn(4, 5)
    with torch.no_grad():
        model_projection = model.heads[0](model.trunk(x))
        target.load_state_dict({k: v for k, v in model.state_dict().items() if "heads.1" not in k})
        torch.testing.assert_close(target(x)[0], model_projection)


def _config(name: str, *overrides: str) -> Any:
    _, cfg = hydra_compose_and_validate([f"config=test/integration_test/quick_{name}", *overrides])
    return cfg


@pytest.mark.parametrize("name", ["byol", "simsiam"])
def test_quick_config_infers_the_width(name: str) -> None:
    cfg = _config(name, f"config.LOSS.{name}_loss.embedding_dim=5")
    loss = build_loss(cfg.LOSS, cfg)
    assert loss.embedding_dim == 32


@pytest.mark.parametrize("name", ["byol", "simsiam"])
@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,32]}]]", "projector and a predictor"),
        (
            "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,32]}],[mlp,{dims:[32,16]}]]",
            "widths must match",
        ),
        (
            "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,32]}],[mlp,{dims:[16,32]}]]",
            "input width 16",
        ),
        ("config.DATA.TRAIN.TRANSFORMS.0.num_times=3", "exactly 2 views"),
    ],
)
def test_config_mistakes_are_config_errors(name: str, override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        cfg = _config(name, override)
        build_loss(cfg.LOSS, cfg)


@pytest.mark.parametrize("value", [-0.1, 1.5, "a", True])
def test_byol_momentum_must_be_in_the_unit_interval(value: Any) -> None:
    with pytest.raises(ConfigError, match="byol_loss.momentum"):
        build_loss(AttrDict(name="byol_loss", byol_loss={"momentum": value}))


@pytest.mark.parametrize("value", [0, -3, 2.5])
def test_simsiam_width_must_be_positive(value: Any) -> None:
    with pytest.raises(ConfigError, match="simsiam_loss.embedding_dim"):
        build_loss(AttrDict(name="simsiam_loss", simsiam_loss={"embedding_dim": value}))


def test_simsiam_collapse_hook_warns_on_identical_outputs(caplog: Any) -> None:
    loss = SimSiamLoss(embedding_dim=8)
    model = _TinyModel()
    loss.bind_model(model)
    hook = SimSiamCollapseHook(loss)
    task = AttrDict(train=True)
    hook.on_phase_start(task)  # type: ignore[arg-type]
    with torch.no_grad():
        model.heads[0][0].weight.zero_()  # every projection is the bias: collapse
    model.train()
    loss.train()
    p = model(torch.randn(8, 5))[0]
    loss(p)
    with caplog.at_level("WARNING"):
        hook.on_phase_end(task)  # type: ignore[arg-type]
    assert hook.last_std is not None and hook.last_std < 1e-3
    assert "collapsed" in caplog.text
    caplog.clear()
    torch.manual_seed(4)
    healthy = _TinyModel()
    loss.bind_model(healthy)
    hook.on_phase_start(task)  # type: ignore[arg-type]
    loss(healthy(torch.randn(64, 5))[0])
    with caplog.at_level("WARNING"):
        hook.on_phase_end(task)  # type: ignore[arg-type]
    assert hook.last_std is not None and hook.last_std > 0.1 / math.sqrt(8)
    assert "collapsed" not in caplog.text

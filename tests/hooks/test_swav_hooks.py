"""SwAVTrackingHook's collapse warning: a train phase whose mean loss sits at ln K (uniform
codes) is reported as collapsed; a loss away from ln K, or a test phase, is not."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

from vissl.hooks.swav_hooks import SwAVTrackingHook


def _task(mean_loss: float, train: bool = True, protos: int = 50) -> SimpleNamespace:
    loss = SimpleNamespace(uniform_loss=math.log(protos))
    return SimpleNamespace(
        loss=loss, train=train, phase_idx=3, phase_average_loss=lambda: mean_loss
    )


def _warnings(caplog, task: SimpleNamespace) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vissl.hooks.swav_hooks"):
        SwAVTrackingHook().on_phase_end(task)
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_loss_at_ln_k_is_reported_as_collapsed(caplog) -> None:
    (msg,) = _warnings(caplog, _task(math.log(50) + 1e-4))
    assert "collapsed" in msg and "ln K = 3.9120" in msg and "phase 3" in msg
    assert "epsilon" in msg  # says what to try


@pytest.mark.parametrize(
    "task",
    [
        _task(math.log(50) - 0.3),  # learning: below ln K
        _task(math.log(50), train=False),  # test phases are not checked
        _task(float("nan")),  # a NaN loss is CheckNanLossHook's business
    ],
)
def test_no_warning_otherwise(caplog, task) -> None:
    assert _warnings(caplog, task) == []


def test_normalize_prototypes_on_start_leaves_a_resumed_runs_prototypes_bitwise() -> None:
    """A fresh start normalises the prototypes; a resumed one (steps done) keeps the
    restored ones exactly: normalising unit rows again changes their last bits, and the
    resumed run would drift from the uninterrupted one."""
    import torch
    from torch import nn

    from vissl.hooks.swav_hooks import NormalizePrototypesHook
    from vissl.models.heads.swav_head import SwAVHead

    torch.manual_seed(0)
    model = nn.Module()
    model.heads = nn.ModuleList([SwAVHead({}, dims=[8, 4], num_clusters=[64])])
    weight = model.heads[0].prototypes0.weight
    with torch.no_grad():
        weight.mul_(3.0)
    NormalizePrototypesHook().on_start(SimpleNamespace(base_model=model, loss=None, iteration=0))
    assert torch.allclose(weight.norm(dim=1), torch.ones(64), atol=1e-6)
    restored = weight.detach().clone()
    renormalised = torch.nn.functional.normalize(restored, dim=1)
    assert not torch.equal(renormalised, restored)  # what the old on_start did on resume
    NormalizePrototypesHook().on_start(SimpleNamespace(base_model=model, loss=None, iteration=6))
    assert torch.equal(weight, restored)


def test_normalize_prototypes_hook_finds_the_heads_once_not_every_step(monkeypatch):
    """The heads are found at start; each step's update walks no module tree."""
    from types import SimpleNamespace

    from torch import nn

    from vissl.hooks.swav_hooks import NormalizePrototypesHook

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def normalize_prototypes(self) -> None:
            self.calls += 1

    head = Head()
    task = SimpleNamespace(base_model=nn.Sequential(nn.Linear(2, 2), head), loss=nn.Identity())
    task.iteration = 0
    hook = NormalizePrototypesHook()
    hook.on_start(task)
    walks = []
    real = nn.Module.modules
    monkeypatch.setattr(nn.Module, "modules", lambda self: walks.append(self) or real(self))
    for _ in range(3):
        hook.on_update(task)
    assert walks == [] and head.calls == 4
    task.base_model = nn.Sequential(Head())  # a new model: found again, once
    hook.on_update(task)
    hook.on_update(task)
    assert len(walks) == 2  # the model and the loss, at the first update after the change

"""Gradient reducers on 2 gloo processes: DDP, manual all-reduce, activation checkpointing.

Every check compares against one process that sees the whole batch: with a per-sample
mean loss, no BatchNorm (or synchronised BatchNorm) and equal per-rank batches, the
average of the ranks' gradients is the gradient of the whole batch.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.trainer.gradient_reduction import (
    DDPReduction,
    ManualReduction,
    NoReduction,
    build_gradient_reducer,
)
from vissl.utils.distributed import max_parameter_divergence
from vissl.utils.test_utils import spawn_gloo

_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"


def _model_config(checkpointing: bool, norm: str = "GroupNorm") -> AttrDict:
    cfg: Any = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)
    cfg = AttrDict(copy.deepcopy(cfg))
    cfg.TRUNK.NAME = "resnet"
    cfg.TRUNK.RESNETS.update(
        {"DEPTH": 18, "WIDTH_MULTIPLIER": 0.25, "NORM": norm, "GROUPNORM_GROUPS": 4}
    )
    cfg.HEAD.PARAMS = [["mlp", {"dims": [128, 10]}]]
    cfg.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING = checkpointing
    cfg.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS = 3
    return cfg


def _resnet(checkpointing: bool) -> nn.Module:
    from vissl.models import build_model

    torch.manual_seed(0)
    return build_model(_model_config(checkpointing), AttrDict({}))


def _batch(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    out = out[0] if isinstance(out, list | tuple) else out
    return F.cross_entropy(out, y)


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _step(reducer: NoReduction, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
    wrapped = reducer.wrap(model, torch.device("cpu"))
    with reducer.context(wrapped):
        loss = _loss(wrapped, x, y)
        loss.backward()
    reducer.after_backward(wrapped)
    return wrapped, loss.detach()


def _reference(checkpointing: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = _resnet(checkpointing)
    x, y = _batch()
    loss = _loss(model, x, y)
    loss.backward()
    return loss.detach(), _grads(model)


def _ranks_grads(rank: int, world_size: int, kind: str, checkpointing: bool) -> Any:
    model = _resnet(checkpointing)
    x, y = _batch()
    per = x.shape[0] // world_size
    sl = slice(rank * per, (rank + 1) * per)
    reducer = {"ddp": DDPReduction(), "manual": ManualReduction(bucket_cap_mb=0.05)}[kind]
    _, loss = _step(reducer, model, x[sl], y[sl])
    torch.distributed.all_reduce(loss)
    return float(loss) / world_size, _grads(model)


def test_manual_and_ddp_gradients_equal_and_match_one_process():
    ref_loss, ref = _reference()
    ddp = spawn_gloo(_ranks_grads, 2, "ddp", False)
    manual = spawn_gloo(_ranks_grads, 2, "manual", False)
    for rank in range(2):
        _, g_ddp = ddp[rank]
        loss, g_man = manual[rank]
        assert loss == pytest.approx(float(ref_loss), abs=1e-6)
        assert g_ddp.keys() == g_man.keys() == ref.keys()
        for k in ref:
            # Averaging two values is exact, so manual and DDP agree to the bit.
            assert torch.equal(g_man[k], g_ddp[k]), k
            torch.testing.assert_close(g_man[k], ref[k], rtol=1e-4, atol=1e-6)


def test_activation_checkpointing_with_manual_reduction_same_loss_and_grads():
    ref_loss, ref = _reference(checkpointing=False)
    ck_loss, ck = _reference(checkpointing=True)
    assert float(ck_loss) == pytest.approx(float(ref_loss), abs=1e-6)
    for k in ref:
        torch.testing.assert_close(ck[k], ref[k], rtol=1e-5, atol=1e-7)
    results = spawn_gloo(_ranks_grads, 2, "manual", True)
    plain = spawn_gloo(_ranks_grads, 2, "manual", False)
    for (loss, grads), (loss_plain, grads_plain) in zip(results, plain, strict=True):
        assert loss == pytest.approx(loss_plain, abs=1e-6)
        for k in ref:
            torch.testing.assert_close(grads[k], grads_plain[k], rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(grads[k], ref[k], rtol=1e-4, atol=1e-6)


class _TwoBranches(nn.Module):
    """``b`` is used only when asked: a parameter without a gradient on some ranks."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 2)
        self.b = nn.Linear(4, 2)
        self.never = nn.Linear(4, 2)
        self.register_buffer("counter", torch.zeros(1))

    def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
        self.counter += 1
        return self.a(x) + (self.b(x) if use_b else 0)


def _unused_and_buffers(rank: int, world_size: int) -> Any:
    model = _TwoBranches()
    model.counter.fill_(10.0 * (rank + 1))  # rank 0's buffer must win
    reducer = ManualReduction(find_unused_parameters=True)
    wrapped = reducer.wrap(model, torch.device("cpu"))
    with torch.no_grad():
        model.counter.fill_(10.0 * (rank + 1))  # diverge again after DDP's init sync
    with reducer.context(wrapped):
        wrapped(torch.ones(2, 4) * (rank + 1), use_b=rank == 1).sum().backward()
    reducer.after_backward(wrapped)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.step()
    return {
        "b_grad": model.b.weight.grad.clone(),
        "never_grad": model.never.weight.grad,
        "counter": float(model.counter),
        "divergence": max_parameter_divergence(model),
    }


def test_manual_reduction_unused_parameters_and_buffers():
    r0, r1 = spawn_gloo(_unused_and_buffers, 2)
    # b got a gradient on rank 1 only (2 samples of 2.0 per input: 4.0); as with DDP it
    # is averaged with rank 0's zero.
    expected_b = torch.full((2, 4), (4.0 + 0.0) / 2)
    torch.testing.assert_close(r0["b_grad"], expected_b)
    torch.testing.assert_close(r1["b_grad"], expected_b)
    assert r0["never_grad"] is None and r1["never_grad"] is None
    # Buffers are broadcast from rank 0 before the forward, which then increments them.
    assert r0["counter"] == r1["counter"] == 11.0
    assert r0["divergence"] == r1["divergence"] == 0.0


def test_build_gradient_reducer_choices():
    assert isinstance(build_gradient_reducer(1, manual=True), NoReduction)
    assert type(build_gradient_reducer(1, manual=False)) is NoReduction
    assert type(build_gradient_reducer(2, manual=False)) is DDPReduction
    manual = build_gradient_reducer(2, manual=True, find_unused_parameters=True)
    assert isinstance(manual, ManualReduction) and manual.find_unused_parameters

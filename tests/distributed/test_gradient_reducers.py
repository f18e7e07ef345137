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


class _ThreeBranches(nn.Module):
    """Rank 0 uses ``b``, rank 1 uses ``c`` (same shape): the gradients to reduce differ."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = nn.Linear(4, 2), nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, rank: int) -> torch.Tensor:
        return self.a(x) + (self.b(x) if rank == 0 else self.c(x))


def _mismatched_gradients(rank: int, world_size: int) -> str:
    from vissl.trainer.gradient_reduction import UnusedParametersError

    model = _ThreeBranches()
    reducer = ManualReduction()
    wrapped = reducer.wrap(model, torch.device("cpu"))
    with reducer.context(wrapped):
        wrapped(torch.ones(2, 4), rank=rank).sum().backward()
    try:
        reducer.after_backward(wrapped)
    except UnusedParametersError as err:
        return str(err)
    return "reduced"


def test_manual_reduction_refuses_parameters_without_gradient():
    """#22 item 8: rank 0 has gradients for (a, b), rank 1 for (a, c); the flat buckets had
    equal sizes, so b's gradient was averaged with c's without any error."""
    r0, r1 = spawn_gloo(_mismatched_gradients, 2)
    assert "got no gradient on rank 0" in r0 and "'c.weight'" in r0
    assert "got no gradient on rank 1" in r1 and "'b.weight'" in r1
    assert "MANUAL_GRADIENT_REDUCTION" in r0


class _WithBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(
            nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 4), nn.BatchNorm1d(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _collectives_per_step(rank: int, world_size: int, backend: str) -> dict[str, Any]:
    import torch.distributed as dist

    import vissl.utils.distributed as ud

    model = _WithBatchNorm()
    reducer = ManualReduction(find_unused_parameters=True)
    wrapped = reducer.wrap(model, torch.device("cpu"))
    calls: list[tuple[str, Any, torch.dtype]] = []
    reads: list[str] = []
    real = dist.broadcast, dist.all_reduce, dist.get_backend, torch.Tensor.tolist, torch.Tensor.item

    def spy(name, fn):
        def wrapper(tensor, *args, **kwargs):
            calls.append((name, kwargs.get("group"), tensor.dtype))
            return fn(tensor, *args, **kwargs)

        return wrapper

    side = dist.new_group(backend="gloo")
    dist.broadcast, dist.all_reduce = spy("broadcast", real[0]), spy("all_reduce", real[1])
    torch.Tensor.tolist = lambda t: (reads.append("tolist"), real[3](t))[1]
    torch.Tensor.item = lambda t: (reads.append("item"), real[4](t))[1]
    if backend == "nccl":  # a run on NCCL: the agreement must use the gloo side group
        dist.get_backend = lambda *a, **k: "nccl"
        ud._GLOO_SIDE_GROUP = (id(dist.group.WORLD), side)
    try:
        for _step in range(2):  # the second step is measured
            calls.clear()
            reads.clear()
            for _micro in range(3):  # 3 micro-batches of an accumulated step
                with reducer.context(wrapped):
                    wrapped(torch.randn(4, 4)).sum().backward()
            reducer.after_backward(wrapped)
    finally:
        dist.broadcast, dist.all_reduce, dist.get_backend = real[:3]
        torch.Tensor.tolist, torch.Tensor.item = real[3:]
        ud._GLOO_SIDE_GROUP = None
    flags = [c for c in calls if c[0] == "all_reduce" and c[2] == torch.uint8]
    return {
        "broadcasts": sum(1 for c in calls if c[0] == "broadcast"),
        "flags_on_side_group": [c[1] is side for c in flags],
        "grad_reduces": sum(1 for c in calls if c[0] == "all_reduce" and c[2] == torch.float32),
        "reads": reads,
    }


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_manual_reduction_collectives_per_step(backend):
    """#22 items 9 and 11: buffers are broadcast once per optimizer step (not per
    micro-batch), one collective per dtype; the unused-parameter agreement is one host
    all-reduce on a gloo group (under NCCL too: no device tensor, no device read)."""
    r0, r1 = spawn_gloo(_collectives_per_step, 2, backend)
    for r in (r0, r1):
        assert r["broadcasts"] == 2  # float statistics + int64 counters, once
        assert r["grad_reduces"] == 1
        assert r["flags_on_side_group"] == [backend == "nccl"]
        assert r["reads"] == ["tolist"]  # the host flags, nothing else


def _bucket_views(rank: int, world_size: int) -> tuple[bool, bool]:
    ddp = DDPReduction().wrap(_TwoBranches(), torch.device("cpu"))
    manual = ManualReduction().wrap(_TwoBranches(), torch.device("cpu"))
    return ddp.gradient_as_bucket_view, manual.gradient_as_bucket_view


def test_ddp_gradients_are_bucket_views():
    """#22 item 12: DDP's gradients live in its buckets (no copy in and out); the manual
    reducer's DDP wrapper never reduces, so its gradients stay plain."""
    for ddp_view, manual_view in spawn_gloo(_bucket_views, 2):
        assert ddp_view and not manual_view

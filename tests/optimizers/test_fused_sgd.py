"""Fused SGD with momentum (used when every parameter is on CUDA) against torch's default
SGD, on CPU where torch runs the same fused kernel: parameters that start stepping late
(SwAV's frozen prototypes) and a first step skipped for infs under fp16."""

from __future__ import annotations

import pytest
import torch

from vissl.optimizers import torch_optimizers
from vissl.optimizers.torch_optimizers import ZeroMomentumBuffers, build_sgd


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(7, generator=g)) for _ in range(3)]


def _grads(step: int) -> list[torch.Tensor | None]:
    g = torch.Generator().manual_seed(100 + step)
    grads: list[torch.Tensor | None] = [torch.randn(7, generator=g) for _ in range(3)]
    if step < 2:
        grads[2] = None  # the third parameter steps from the third step on
    return grads


def _run(fused: bool, hook: bool, nesterov: bool = False) -> tuple[list, list]:
    params = _params()
    opt = torch.optim.SGD(
        params, lr=0.1, momentum=0.9, nesterov=nesterov, weight_decay=1e-2, fused=fused
    )
    if hook:
        ZeroMomentumBuffers(opt)
    for step in range(5):
        for p, grad in zip(params, _grads(step), strict=True):
            p.grad = None if grad is None else grad.clone()
        opt.step()
    return [p.detach().clone() for p in params], [opt.state[p]["momentum_buffer"] for p in params]


def test_fused_sgd_alone_fails_on_a_parameter_that_starts_stepping_late() -> None:
    with pytest.raises(TypeError, match="NoneType"):
        _run(fused=True, hook=False)


@pytest.mark.parametrize("nesterov", [False, True])
def test_late_parameters_step_as_with_the_default_implementation(nesterov: bool) -> None:
    weights, buffers = _run(fused=True, hook=True, nesterov=nesterov)
    ref_weights, ref_buffers = _run(fused=False, hook=False, nesterov=nesterov)
    for a, b in zip(weights + buffers, ref_weights + ref_buffers, strict=True):
        torch.testing.assert_close(a, b)


def _skip_first_step(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> None:
    """What GradScaler does for a fused optimizer whose gradients hold infs."""
    for p in params:
        p.grad = torch.full_like(p, float("inf"))
    opt.grad_scale = torch.tensor(1.0)  # type: ignore[attr-defined]
    opt.found_inf = torch.tensor(1.0)  # type: ignore[attr-defined]
    opt.step()
    del opt.grad_scale, opt.found_inf  # type: ignore[attr-defined]


def test_a_skipped_first_step_leaves_zero_buffers_and_the_next_step_is_a_first_step() -> None:
    params = [torch.nn.Parameter(torch.ones(4096))]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True)
    ZeroMomentumBuffers(opt)
    for _ in range(3):  # freed memory that an uninitialised buffer would be given
        junk = torch.full((4096,), 7.0)
        del junk
    _skip_first_step(opt, params)
    assert torch.equal(params[0], torch.ones(4096))
    assert torch.equal(opt.state[params[0]]["momentum_buffer"], torch.zeros(4096))
    grad = torch.linspace(-1, 1, 4096)
    params[0].grad = grad.clone()
    opt.step()
    torch.testing.assert_close(params[0].detach(), torch.ones(4096) - 0.1 * grad)
    torch.testing.assert_close(opt.state[params[0]]["momentum_buffer"], grad)


def test_a_state_dict_without_some_buffers_is_filled_after_loading() -> None:
    params = _params()
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True)
    ZeroMomentumBuffers(opt)
    for p, grad in zip(params, [torch.ones(7), torch.ones(7), torch.ones(7)], strict=True):
        p.grad = grad
    opt.step()  # every parameter holds a buffer: the hook is idle from now on
    saved = _params(1)
    old = torch.optim.SGD(saved, lr=0.1, momentum=0.9, fused=True)
    saved[0].grad = torch.ones(7)
    old.step()  # a checkpoint where only the first parameter has a buffer
    opt.load_state_dict(old.state_dict())
    for p in params:
        p.grad = torch.ones(7)
    opt.step()
    assert all(opt.state[p]["momentum_buffer"] is not None for p in params)


def test_build_sgd_uses_the_hook_with_fused_and_not_fused_with_dampening(monkeypatch) -> None:
    monkeypatch.setattr(torch_optimizers, "_implementation", lambda *_: {"fused": True})
    groups = [{"params": _params(), "lr": 0.1, "weight_decay": 0.0}]
    opt = build_sgd({"momentum": 0.9}, groups)
    assert opt.defaults["fused"] and opt._optimizer_step_pre_hooks
    groups = [{"params": _params(), "lr": 0.1, "weight_decay": 0.0}]
    damped = build_sgd({"momentum": 0.9, "dampening": 0.1}, groups)
    assert not damped.defaults["fused"]

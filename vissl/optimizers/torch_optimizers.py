"""The built-in optimizers: ``sgd``, ``adam`` and ``adamw`` over prepared param groups.

Each registered builder is ``fn(optimizer_config, param_groups) -> torch.optim.Optimizer``;
the param groups (see :mod:`vissl.optimizers.param_groups`) already carry ``lr`` and
``weight_decay``. Keys read, under ``config.OPTIMIZER``:

* ``sgd``: ``momentum`` (in [0, 1)), ``nesterov``, ``dampening`` (optional)
* ``adam`` / ``adamw``: ``betas`` (two values in [0, 1)), ``eps`` (default 1e-8),
  ``amsgrad`` (default false)

When every parameter is a floating-point CUDA tensor, torch's fused implementation is
used (one kernel for all parameters): faster, and under fp16 the GradScaler then skips
a step with infs on the device instead of reading its found-inf flag back (a host sync
per step with the other implementations).

Fused SGD with momentum needs every stepping parameter to hold a momentum buffer, or none
to: torch's fused kernel raises a ``TypeError`` when only some do (SwAV's prototypes, frozen
for the first iterations, start stepping after the rest), and when its very first step is
skipped for infs under fp16 it keeps the uninitialised buffers it allocated (garbage that
turns the next step's update into NaN or huge values). :class:`ZeroMomentumBuffers`, a
step pre-hook, gives each parameter about to step without a buffer a zero one; with no
dampening ``momentum * 0 + grad`` is exactly the ``grad`` a first step stores, so the
updates equal the other implementations'. With dampening fused SGD is not used.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from vissl.errors import ConfigError
from vissl.optimizers import register_optimizer
from vissl.optimizers._checks import get_bool, get_number, is_number

_PATH = "config.OPTIMIZER"


def _betas(cfg: Mapping[str, Any]) -> tuple[float, float]:
    betas = cfg.get("betas", (0.9, 0.999))
    if (
        not isinstance(betas, list | tuple)
        or len(betas) != 2
        or not all(is_number(b) and 0.0 <= b < 1.0 for b in betas)
    ):
        raise ConfigError(
            f"{_PATH}.betas must be two numbers in [0, 1), got {betas!r}.", f"{_PATH}.betas"
        )
    return float(betas[0]), float(betas[1])


def _implementation(
    optimizer: type[torch.optim.Optimizer], param_groups: list[dict[str, Any]]
) -> dict[str, Any]:
    """``{"fused": True}`` when every parameter is a floating CUDA tensor (see above)."""
    params = [p for g in param_groups for p in g["params"]]
    if (
        params
        and all(p.is_cuda and p.is_floating_point() for p in params)
        and "fused" in inspect.signature(optimizer.__init__).parameters
    ):
        return {"fused": True}
    return {}


class ZeroMomentumBuffers:
    """Step pre-hook of a fused SGD: a zero momentum buffer for each parameter about to
    step without one (see the module's docstring). Each step looks only at the parameters
    still without a buffer (none, after the first step of most runs); loading a state dict
    or adding a group makes it look at every parameter again."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._pending: list[torch.Tensor] | None = None  # None: look at every parameter
        self._count = -1
        optimizer.register_step_pre_hook(self)
        optimizer.register_load_state_dict_post_hook(self._reset)

    def _reset(self, optimizer: torch.optim.Optimizer) -> None:
        self._pending = None

    def __call__(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        count = sum(len(g["params"]) for g in optimizer.param_groups)
        if self._pending is None or count != self._count:
            self._count = count
            self._pending = [
                p for g in optimizer.param_groups if g["momentum"] != 0 for p in g["params"]
            ]
        waiting = []
        for p in self._pending:
            state = optimizer.state[p]
            if state.get("momentum_buffer") is not None:
                continue
            if p.grad is None:
                waiting.append(p)
            else:
                state["momentum_buffer"] = torch.zeros_like(p)
        self._pending = waiting


@register_optimizer("sgd")
def build_sgd(cfg: Mapping[str, Any], param_groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """``torch.optim.SGD`` with ``momentum``, ``nesterov`` and per-group weight decay."""
    momentum = get_number(
        cfg, "momentum", _PATH, default=0.0, min_value=0.0, max_value=1.0, max_inclusive=False
    )
    nesterov = get_bool(cfg, "nesterov", _PATH, default=False)
    dampening = get_number(cfg, "dampening", _PATH, default=0.0, min_value=0.0)
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ConfigError(
            f"{_PATH}.nesterov needs {_PATH}.momentum > 0 and no dampening; got momentum "
            f"{momentum}, dampening {dampening}.",
            f"{_PATH}.nesterov",
        )
    implementation = _implementation(torch.optim.SGD, param_groups)
    if momentum and dampening:
        implementation = {}  # a zero first buffer would be damped (module docstring)
    optimizer = torch.optim.SGD(
        param_groups,
        lr=param_groups[0]["lr"],
        momentum=momentum,
        dampening=dampening,
        nesterov=nesterov,
        weight_decay=param_groups[0].get("weight_decay", 0.0),
        **implementation,
    )
    if implementation.get("fused") and momentum:
        ZeroMomentumBuffers(optimizer)
    return optimizer


def _adam_kwargs(cfg: Mapping[str, Any], param_groups: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "lr": param_groups[0]["lr"],
        "betas": _betas(cfg),
        "eps": get_number(cfg, "eps", _PATH, default=1e-8, min_value=0.0),
        "weight_decay": param_groups[0].get("weight_decay", 0.0),
        "amsgrad": get_bool(cfg, "amsgrad", _PATH, default=False),
    }


@register_optimizer("adam")
def build_adam(cfg: Mapping[str, Any], param_groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """``torch.optim.Adam`` (L2 weight decay added to the gradient)."""
    kwargs = _adam_kwargs(cfg, param_groups) | _implementation(torch.optim.Adam, param_groups)
    return torch.optim.Adam(param_groups, **kwargs)


@register_optimizer("adamw")
def build_adamw(
    cfg: Mapping[str, Any], param_groups: list[dict[str, Any]]
) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` (decoupled weight decay)."""
    kwargs = _adam_kwargs(cfg, param_groups) | _implementation(torch.optim.AdamW, param_groups)
    return torch.optim.AdamW(param_groups, **kwargs)


# VISSL's FSDP optimizer name: SGD (with LARC when OPTIMIZER.use_larc, which works on
# sharded parameters here); VISSL needed its own class because apex's LARC did not.
register_optimizer("sgd_fsdp")(build_sgd)

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
from dataclasses import dataclass
from typing import Annotated, Any

import torch

from vissl.config.params import NonNegative, UnitOpen, parse
from vissl.errors import ConfigError
from vissl.optimizers import register_optimizer

_PATH = "config.OPTIMIZER"


_Momentum = Annotated[int | float, UnitOpen]
_Beta = Annotated[float, UnitOpen]


@dataclass(kw_only=True, frozen=True)
class SGDParams:
    """What ``sgd`` reads of ``config.OPTIMIZER``."""

    momentum: _Momentum = 0.0
    #: null: false
    nesterov: bool | None = False
    dampening: Annotated[int | float, NonNegative] = 0.0

    def check(self, key_path: str) -> None:
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ConfigError(
                f"{key_path}.nesterov needs {key_path}.momentum > 0 and no dampening; got "
                f"momentum {self.momentum}, dampening {self.dampening}.",
                f"{key_path}.nesterov",
            )


@dataclass(kw_only=True, frozen=True)
class AdamParams:
    """What ``adam`` and ``adamw`` read of ``config.OPTIMIZER``."""

    betas: tuple[_Beta, _Beta] = (0.9, 0.999)
    eps: Annotated[int | float, NonNegative] = 1e-8
    #: null: false
    amsgrad: bool | None = False


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
    p = parse(SGDParams, cfg, _PATH, shared=True)
    momentum, dampening, nesterov = p.momentum, p.dampening, bool(p.nesterov)
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
    p = parse(AdamParams, cfg, _PATH, shared=True)
    return {
        "lr": param_groups[0]["lr"],
        "betas": p.betas,
        "eps": p.eps,
        "weight_decay": param_groups[0].get("weight_decay", 0.0),
        "amsgrad": bool(p.amsgrad),
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

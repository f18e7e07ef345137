"""``lars``: LARS (You et al. 2017) as Barlow Twins and BYOL use it (``OPTIMIZER.name: lars``).

For each parameter ``p`` with gradient ``g``, in its param group (``lr``, ``weight_decay``,
``momentum``, ``nesterov``, ``eta``, ``exclude_bias_and_norm``)::

    d = g + weight_decay * p                                  # unless excluded
    trust = eta * ||p|| / ||d||  if ||p|| > 0 and ||d|| > 0 else 1   # 1 if excluded
    d = d * trust
    mu = momentum * mu + d                                    # mu = d on the first step
    p = p - lr * (d + momentum * mu if nesterov else mu)

Excluded parameters: with ``exclude_bias_and_norm`` true, every 1-D parameter (biases and
the weights and biases of normalisation layers), the rule of the Barlow Twins code
(``p.ndim == 1``), gets neither weight decay nor the trust ratio. The switch is a
per-group hyperparameter (saved in the state dict with the groups); the test is per
parameter, so it is independent of how the param groups split regularized and
unregularized parameters. Weight decay is otherwise the group's own ``weight_decay``, so
the groups of :mod:`vissl.optimizers.param_groups` (bn / bias / head settings) and a
``param_schedulers.weight_decay`` schedule apply as for ``sgd``.

The gradients themselves are left unchanged; the rescaling runs on the device without
reading values back to the host. State per parameter: ``momentum_buffer`` (absent when
``momentum`` is 0), as in ``torch.optim.SGD``.

Keys read, under ``config.OPTIMIZER``: ``momentum`` (in [0, 1)), ``nesterov`` (needs
``momentum`` > 0), ``eta`` (> 0), ``exclude_bias_and_norm``; ``weight_decay`` through the
param groups. ``use_larc: true`` is refused: LARC would adapt the rate a second time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch.optim import Optimizer

from vissl.config.params import Positive, UnitOpen, parse
from vissl.errors import ConfigError
from vissl.optimizers import register_optimizer
from vissl.optimizers._checks import get_bool

_PATH = "config.OPTIMIZER"


def is_bias_or_norm(param: torch.Tensor) -> bool:
    """Whether ``param`` is excluded by ``exclude_bias_and_norm`` (a 1-D parameter)."""
    return param.ndim == 1


class LARS(Optimizer):
    """LARS with SGD momentum; see the module docstring for the update.

    Args:
        params: parameters or param groups (groups may override any default below).
        lr: learning rate.
        momentum: momentum factor in [0, 1).
        weight_decay: L2 penalty added to the gradient before the trust ratio.
        eta: trust coefficient (> 0).
        nesterov: use Nesterov momentum (needs ``momentum`` > 0).
        exclude_bias_and_norm: no weight decay and no trust ratio for 1-D parameters.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 0.001,
        nesterov: bool = False,
        exclude_bias_and_norm: bool = False,
    ) -> None:
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}.")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}.")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}.")
        if eta <= 0:
            raise ValueError(f"eta must be > 0, got {eta}.")
        if nesterov and momentum <= 0:
            raise ValueError("nesterov momentum needs momentum > 0.")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "eta": eta,
            "nesterov": nesterov,
            "exclude_bias_and_norm": exclude_bias_and_norm,
        }
        super().__init__(params, defaults)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)
            group.setdefault("exclude_bias_and_norm", False)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One LARS update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = group["lr"]
            momentum = group["momentum"]
            weight_decay = group["weight_decay"]
            eta = group["eta"]
            nesterov = group["nesterov"]
            exclude = group["exclude_bias_and_norm"]
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise RuntimeError("LARS does not support sparse gradients.")
                adapt = not (exclude and p.ndim == 1)  # is_bias_or_norm, inlined (per step)
                d_p = grad.add(p, alpha=weight_decay) if adapt and weight_decay != 0 else grad
                if adapt:
                    param_norm = torch.linalg.vector_norm(p)
                    update_norm = torch.linalg.vector_norm(d_p)
                    one = torch.ones_like(param_norm)
                    trust = torch.where(
                        (param_norm > 0) & (update_norm > 0), eta * param_norm / update_norm, one
                    )
                    d_p = d_p.mul(trust)
                if momentum != 0:
                    state = self.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = torch.clone(d_p).detach()
                        state["momentum_buffer"] = buf
                    else:
                        buf.mul_(momentum).add_(d_p)
                    d_p = d_p.add(buf, alpha=momentum) if nesterov else buf
                p.add_(d_p, alpha=-lr)
        return loss


@dataclass(kw_only=True, frozen=True)
class LARSParams:
    """What ``lars`` reads of ``config.OPTIMIZER``."""

    momentum: Annotated[int | float, UnitOpen] = 0.9
    #: null: false
    nesterov: bool | None = False
    #: the trust coefficient
    eta: Annotated[int | float, Positive] = 0.001
    #: null: false
    exclude_bias_and_norm: bool | None = False

    def check(self, key_path: str) -> None:
        if self.nesterov and self.momentum <= 0:
            raise ConfigError(
                f"{key_path}.nesterov needs {key_path}.momentum > 0, got momentum {self.momentum}.",
                f"{key_path}.nesterov",
            )


@register_optimizer("lars")
def build_lars(cfg: Mapping[str, Any], param_groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """:class:`LARS` over the param groups, configured by ``config.OPTIMIZER``."""
    if get_bool(cfg, "use_larc", _PATH, default=False):
        raise ConfigError(
            f"{_PATH}.use_larc is true with {_PATH}.name lars: LARC would adapt the layer-wise "
            "rate a second time. Set use_larc to false (LARS's trust coefficient is "
            f"{_PATH}.eta) or use name: sgd with LARC.",
            f"{_PATH}.use_larc",
        )
    p = parse(LARSParams, cfg, _PATH, shared=True)
    return LARS(
        param_groups,
        lr=param_groups[0]["lr"],
        momentum=p.momentum,
        weight_decay=param_groups[0].get("weight_decay", 0.0),
        eta=p.eta,
        nesterov=bool(p.nesterov),
        exclude_bias_and_norm=bool(p.exclude_bias_and_norm),
    )

"""LARC (layer-wise adaptive rate clipping/scaling), natively, with apex's semantics.

Before each step of the wrapped optimizer, every parameter's gradient is replaced by
``(g + wd * w) * local_lr`` with

* ``local_lr = trust_coefficient * ||w|| / (||g|| + wd * ||w|| + eps)`` (scaling), or
* ``min(local_lr / lr, 1)`` when ``clip`` is true, so that the effective rate is
  ``min(local_lr, lr)`` (clipping),

where ``wd`` is the group's ``weight_decay``, which the wrapped optimizer does not apply
itself during that step (it is set to 0 and restored afterwards). As in apex, a parameter
whose weight or gradient norm is 0 keeps its gradient unchanged and gets no weight decay.
The rescaling runs on the device, without reading values back to the host.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.optim import Optimizer


class LARC(Optimizer):
    """Wrap ``optimizer`` with LARC; groups and state are the wrapped optimizer's.

    Args:
        optimizer: the optimizer to wrap (typically SGD).
        trust_coefficient: the trust ratio ``eta``.
        clip: clip the adaptive rate to the group's ``lr`` (LARC) instead of scaling it.
        eps: added to the denominator.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        trust_coefficient: float = 0.02,
        clip: bool = True,
        eps: float = 1e-8,
    ) -> None:
        # The wrapped optimizer owns param_groups, state and defaults (see the properties),
        # so Optimizer.__init__ (which would re-register the groups) is not called; only
        # the hook tables that the base class methods use are set up.
        self.optim = optimizer
        self.trust_coefficient = float(trust_coefficient)
        self.clip = bool(clip)
        self.eps = float(eps)
        self._init_hooks()

    def _init_hooks(self) -> None:
        for attr in (
            "_optimizer_step_pre_hooks",
            "_optimizer_step_post_hooks",
            "_optimizer_state_dict_pre_hooks",
            "_optimizer_state_dict_post_hooks",
            "_optimizer_load_state_dict_pre_hooks",
            "_optimizer_load_state_dict_post_hooks",
        ):
            setattr(self, attr, OrderedDict())
        patch = getattr(self, "_patch_step_function", None)
        if callable(patch):
            patch()

    # ------------------------------------------------------------------ delegation
    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optim.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optim.param_groups = value

    @property  # type: ignore[override]
    def state(self) -> Any:  # type: ignore[override]
        return self.optim.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optim.state = value

    @property  # type: ignore[override]
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optim.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optim.defaults = value

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The wrapped optimizer's state dict (LARC itself has no state)."""
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load into the wrapped optimizer."""
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients of the wrapped optimizer's parameters."""
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group to the wrapped optimizer."""
        self.optim.add_param_group(param_group)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "optim": self.optim,
            "trust_coefficient": self.trust_coefficient,
            "clip": self.clip,
            "eps": self.eps,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_hooks()

    def __repr__(self) -> str:
        return (
            f"LARC(trust_coefficient={self.trust_coefficient}, clip={self.clip}, "
            f"eps={self.eps}, optimizer={self.optim!r})"
        )

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def _rescale_gradients(self) -> list[Any]:
        saved_weight_decays = []
        for group in self.optim.param_groups:
            weight_decay = group.get("weight_decay", 0.0)
            saved_weight_decays.append(weight_decay)
            lr = group["lr"]
            for p in group["params"]:
                grad = p.grad
                if grad is None:
                    continue
                weight = p.detach()
                param_norm = torch.linalg.vector_norm(weight)
                grad_norm = torch.linalg.vector_norm(grad)
                adaptive_lr = (
                    self.trust_coefficient
                    * param_norm
                    / (grad_norm + param_norm * weight_decay + self.eps)
                )
                if self.clip:
                    if isinstance(lr, torch.Tensor) or lr != 0:
                        adaptive_lr = torch.clamp(adaptive_lr / lr, max=1.0)
                    else:
                        adaptive_lr = torch.ones_like(adaptive_lr)
                active = (param_norm != 0) & (grad_norm != 0)
                scale = torch.where(active, adaptive_lr, torch.ones_like(adaptive_lr))
                if weight_decay != 0:
                    decay = torch.where(
                        active,
                        torch.full_like(param_norm, float(weight_decay)),
                        torch.zeros_like(param_norm),
                    )
                    grad.add_(weight * decay.to(grad.dtype))
                grad.mul_(scale.to(grad.dtype))
        return saved_weight_decays

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Rescale the gradients (see the module docstring), then step the wrapped optimizer."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        saved = self._rescale_gradients()
        try:
            # The decay is already in the gradient: the wrapped optimizer must not add it.
            for group in self.optim.param_groups:
                group["weight_decay"] = 0.0
            self.optim.step()
        finally:
            for group, weight_decay in zip(self.optim.param_groups, saved):
                group["weight_decay"] = weight_decay
        return loss

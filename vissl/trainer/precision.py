"""Precision strategies, chosen once from ``MODEL.AMP_PARAMS``.

The train step never branches on the AMP type; it calls::

    with task.precision.autocast():
        loss = ...
    task.precision.backward(loss)
    task.precision.step(optimizer)

- fp32: autocast is a no-op, backward and step are the plain calls.
- bf16: ``torch.autocast`` with ``torch.bfloat16`` on CPU or CUDA; no loss scaling.
- fp16: ``torch.autocast`` with ``torch.float16`` plus a ``GradScaler`` (CUDA only).
  The scaler's state is part of :meth:`Precision.state_dict`, so checkpoints keep it.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from vissl.errors import ConfigError, UnsupportedConfigWarning

logger = logging.getLogger(__name__)

_DTYPES = {
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


class Precision:
    """fp32: no autocast, no loss scaling."""

    name = "fp32"
    amp_type: str | None = None
    grad_scaler: Any = None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients to their true scale (before clipping). No-op without a scaler."""

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class AutocastPrecision(Precision):
    """Mixed precision through ``torch.autocast`` (bf16 on CPU or CUDA)."""

    amp_type = "pytorch"

    def __init__(self, device_type: str, dtype: torch.dtype) -> None:
        self.device_type = device_type
        self.dtype = dtype
        self.name = "bf16" if dtype == torch.bfloat16 else "fp16"

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)


class GradScalerPrecision(AutocastPrecision):
    """fp16 autocast with dynamic loss scaling (CUDA)."""

    def __init__(self, device_type: str, scaler_kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__(device_type, torch.float16)
        self.grad_scaler = torch.amp.GradScaler(device_type, **dict(scaler_kwargs or {}))
        self._unscaled = False

    def backward(self, loss: torch.Tensor) -> None:
        self.grad_scaler.scale(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        self.grad_scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.grad_scaler.step(optimizer)
        self.grad_scaler.update()

    def state_dict(self) -> dict[str, Any]:
        return {"grad_scaler": self.grad_scaler.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "grad_scaler" in state:
            self.grad_scaler.load_state_dict(state["grad_scaler"])


_SCALER_KEYS = {"init_scale", "growth_factor", "backoff_factor", "growth_interval"}


def build_precision(amp_params: Mapping[str, Any], device: torch.device) -> Precision:
    """Pick the precision strategy from ``MODEL.AMP_PARAMS`` for ``device``.

    Raises:
        ConfigError: for an unknown AMP_TYPE or AMP_DTYPE.
    """
    if not amp_params.get("USE_AMP", False):
        return Precision()
    amp_type = str(amp_params.get("AMP_TYPE", "pytorch")).lower()
    if amp_type == "apex":
        warnings.warn(
            "config.MODEL.AMP_PARAMS.AMP_TYPE=apex: apex is not used; running torch AMP "
            "(torch.autocast) instead. Set AMP_TYPE: pytorch to silence this warning.",
            UnsupportedConfigWarning,
            stacklevel=2,
        )
    elif amp_type != "pytorch":
        raise ConfigError(
            f"config.MODEL.AMP_PARAMS.AMP_TYPE={amp_type!r} is not supported: use 'pytorch' "
            "(or 'apex', which runs torch AMP).",
            "config.MODEL.AMP_PARAMS.AMP_TYPE",
        )
    dtype_name = str(amp_params.get("AMP_DTYPE", "float16")).lower()
    if dtype_name not in _DTYPES:
        raise ConfigError(
            f"config.MODEL.AMP_PARAMS.AMP_DTYPE={dtype_name!r} is not supported: use "
            "'float16' or 'bfloat16'.",
            "config.MODEL.AMP_PARAMS.AMP_DTYPE",
        )
    dtype = _DTYPES[dtype_name]
    if dtype == torch.float16 and device.type != "cuda":
        warnings.warn(
            "config.MODEL.AMP_PARAMS: float16 mixed precision needs CUDA; running on "
            f"{device.type} with bfloat16 autocast instead. Set "
            "config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16 to silence this warning.",
            UnsupportedConfigWarning,
            stacklevel=2,
        )
        dtype = torch.bfloat16
    if dtype == torch.bfloat16:
        return AutocastPrecision(device.type, torch.bfloat16)
    amp_args = amp_params.get("AMP_ARGS") or {}
    scaler_kwargs = {k: v for k, v in dict(amp_args).items() if k in _SCALER_KEYS}
    return GradScalerPrecision(device.type, scaler_kwargs)

"""Losses: ``@register_loss(name)``; selected by LOSS.name with parameters under LOSS.<name>.

A loss is an ``nn.Module`` whose ``forward(output, target)`` returns a scalar tensor, or
a dict whose ``"loss"`` entry is backpropagated (other entries are logged). Any
``torch.nn`` loss can be used by its class name (e.g. ``CrossEntropyLoss``).
"""

from __future__ import annotations

from typing import Any

from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry

LOSS_REGISTRY: Registry[Any] = Registry("loss", config_key="config.LOSS.name")


def register_loss(name: str) -> Any:
    """Decorator registering a loss class under ``name``."""
    return LOSS_REGISTRY.register(name)


def get_loss(name: str) -> Any:
    """The loss class registered as ``name`` (or the torch.nn loss of that name)."""
    return LOSS_REGISTRY.get(name)


import_submodules(__name__)

from vissl.losses.build import build_loss, infer_loss_config  # noqa: E402

__all__ = ["LOSS_REGISTRY", "build_loss", "get_loss", "infer_loss_config", "register_loss"]

"""Optimizers: ``@register_optimizer(name)`` builders; selected by OPTIMIZER.name."""

from __future__ import annotations

from typing import Any

from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry

OPTIMIZER_REGISTRY: Registry[Any] = Registry("optimizer", config_key="config.OPTIMIZER.name")


def register_optimizer(name: str) -> Any:
    """Decorator registering an optimizer builder under ``name``."""
    return OPTIMIZER_REGISTRY.register(name)


def get_optimizer(name: str) -> Any:
    return OPTIMIZER_REGISTRY.get(name)


import_submodules(__name__)

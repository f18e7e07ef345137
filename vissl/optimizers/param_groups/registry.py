"""The param-group constructor registry (VISSL's import path:
``from vissl.optimizers.param_groups.registry import register_param_group_constructor``).

The constructors' modules import it from here, not from the package, so the package can
import them without an import cycle.
"""

from __future__ import annotations

from typing import Any

from vissl.utils.registry import Registry

PARAM_GROUP_CONSTRUCTOR_REGISTRY: Registry[Any] = Registry(
    "param group constructor", config_key="config.OPTIMIZER.param_group_constructor"
)


def register_param_group_constructor(name: str) -> Any:
    """Decorator registering a param-group constructor under ``name``."""
    return PARAM_GROUP_CONSTRUCTOR_REGISTRY.register(name)


def get_param_group_constructor(name: str) -> Any:
    """The constructor registered as ``name`` (UnknownNameError lists the names)."""
    return PARAM_GROUP_CONSTRUCTOR_REGISTRY.get(name)


__all__ = [
    "PARAM_GROUP_CONSTRUCTOR_REGISTRY",
    "get_param_group_constructor",
    "register_param_group_constructor",
]

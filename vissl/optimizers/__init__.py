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
    """The optimizer builder registered as ``name``."""
    return OPTIMIZER_REGISTRY.get(name)


import_submodules(__name__)

from vissl.optimizers.build import build_optimizer  # noqa: E402
from vissl.optimizers.larc import LARC  # noqa: E402
from vissl.optimizers.param_groups import get_optimizer_param_groups  # noqa: E402
from vissl.optimizers.param_scheduler import (  # noqa: E402
    ParamSchedulerSet,
    build_param_schedulers,
)

__all__ = [
    "LARC",
    "OPTIMIZER_REGISTRY",
    "ParamSchedulerSet",
    "build_optimizer",
    "build_param_schedulers",
    "get_optimizer",
    "get_optimizer_param_groups",
    "register_optimizer",
]

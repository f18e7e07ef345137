"""Param schedulers: ``@register_param_scheduler(name)`` builders of fvcore ``ParamScheduler``s.

Selected by ``OPTIMIZER.param_schedulers.<lr|lr_head>.name``.
"""

from __future__ import annotations

from typing import Any

from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry

PARAM_SCHEDULER_REGISTRY: Registry[Any] = Registry(
    "param scheduler", config_key="config.OPTIMIZER.param_schedulers.lr.name"
)


def register_param_scheduler(name: str) -> Any:
    """Decorator registering a param-scheduler builder under ``name``."""
    return PARAM_SCHEDULER_REGISTRY.register(name)


def get_param_scheduler(name: str) -> Any:
    """The builder registered as ``name``."""
    return PARAM_SCHEDULER_REGISTRY.get(name)


import_submodules(__name__)

from vissl.optimizers.param_scheduler.scheduler_set import (  # noqa: E402
    ParamSchedulerSet,
    build_param_schedulers,
)
from vissl.optimizers.param_scheduler.schedulers import build_param_scheduler  # noqa: E402

__all__ = [
    "PARAM_SCHEDULER_REGISTRY",
    "ParamSchedulerSet",
    "build_param_scheduler",
    "build_param_schedulers",
    "get_param_scheduler",
    "register_param_scheduler",
]

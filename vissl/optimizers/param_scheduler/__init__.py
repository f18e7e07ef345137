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
    return PARAM_SCHEDULER_REGISTRY.get(name)


import_submodules(__name__)

"""Meters: ``@register_meter(name)``; selected by METERS.names, parameters under METERS.<name>."""

from __future__ import annotations

from typing import Any

from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry

METER_REGISTRY: Registry[Any] = Registry("meter", config_key="config.METERS.names")


def register_meter(name: str) -> Any:
    """Decorator registering a meter class under ``name``."""
    return METER_REGISTRY.register(name)


def get_meter(name: str) -> Any:
    return METER_REGISTRY.get(name)


import_submodules(__name__)

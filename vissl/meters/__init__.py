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
    """The meter class registered as ``name``."""
    return METER_REGISTRY.get(name)


import_submodules(__name__)

from vissl.meters.build import build_meters  # noqa: E402

__all__ = ["METER_REGISTRY", "build_meters", "get_meter", "register_meter"]

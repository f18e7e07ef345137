"""Model trunks: ``@register_model_trunk(name)`` classes built as ``cls(model_config, model_name)``."""

from __future__ import annotations

from typing import Any

from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry

MODEL_TRUNKS_REGISTRY: Registry[Any] = Registry("model trunk", config_key="config.MODEL.TRUNK.NAME")


def register_model_trunk(name: str) -> Any:
    """Decorator registering a trunk class under ``name`` (selected by MODEL.TRUNK.NAME)."""
    return MODEL_TRUNKS_REGISTRY.register(name)


def get_model_trunk(name: str) -> Any:
    return MODEL_TRUNKS_REGISTRY.get(name)


import_submodules(__name__)

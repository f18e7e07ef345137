"""Model heads: ``@register_model_head(name)`` classes built as ``cls(model_config, **kwargs)``."""

from __future__ import annotations

from typing import Any

from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry

MODEL_HEADS_REGISTRY: Registry[Any] = Registry("model head", config_key="config.MODEL.HEAD.PARAMS")


def register_model_head(name: str) -> Any:
    """Decorator registering a head class under ``name`` (used in MODEL.HEAD.PARAMS)."""
    return MODEL_HEADS_REGISTRY.register(name)


def get_model_head(name: str) -> Any:
    return MODEL_HEADS_REGISTRY.get(name)


import_submodules(__name__)

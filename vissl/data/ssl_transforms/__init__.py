"""Transforms: ``@register_transform(name)``; every torchvision transform works by name too.

Selected by ``DATA.<split>.TRANSFORMS: [{name: ..., indices: [...], <kwargs>}]``.
"""

from __future__ import annotations

from typing import Any

from vissl.utils.registry import Registry

TRANSFORM_REGISTRY: Registry[Any] = Registry(
    "transform", config_key="config.DATA.<split>.TRANSFORMS[].name"
)


def register_transform(name: str) -> Any:
    """Decorator registering a transform class under ``name``."""
    return TRANSFORM_REGISTRY.register(name)


def get_transform(name: str) -> Any:
    return TRANSFORM_REGISTRY.get(name)

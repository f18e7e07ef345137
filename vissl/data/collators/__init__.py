"""Collators: ``@register_collator(name)`` functions ``fn(batch, **params)``.

Selected by ``DATA.<split>.COLLATE_FUNCTION`` with ``COLLATE_FUNCTION_PARAMS``.
"""

from __future__ import annotations

from typing import Any

from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry

COLLATOR_REGISTRY: Registry[Any] = Registry(
    "collator", config_key="config.DATA.<split>.COLLATE_FUNCTION"
)


def register_collator(name: str) -> Any:
    """Decorator registering a collate function under ``name``."""
    return COLLATOR_REGISTRY.register(name)


def get_collator(name: str) -> Any:
    """The collate function registered as ``name`` (UnknownNameError lists the names)."""
    return COLLATOR_REGISTRY.get(name)


import_submodules(__name__)

"""Data sources: ``@register_data_source(name)``; selected by DATA.<split>.DATA_SOURCES.

A data source is a class built as ``cls(cfg, path, split, dataset_name, data_source)``
returning ``(image, is_valid)`` from ``__getitem__`` and its size from ``__len__``.
"""

from __future__ import annotations

from typing import Any

from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry

DATA_SOURCE_REGISTRY: Registry[Any] = Registry(
    "data source", config_key="config.DATA.<split>.DATA_SOURCES"
)


def register_data_source(name: str) -> Any:
    """Decorator registering a data source class under ``name``."""
    return DATA_SOURCE_REGISTRY.register(name)


def get_data_source(name: str) -> Any:
    """The data source class registered as ``name`` (UnknownNameError lists the names)."""
    return DATA_SOURCE_REGISTRY.get(name)


import_submodules(__name__)

"""Engines: ``@register_engine(name)`` classes selected by the root key ``engine_name``.

An engine subclasses :class:`Engine` and implements
``run_engine(cfg, dist_run_id, checkpoint_path, checkpoint_folder, local_rank, node_id,
hook_generator)`` as in VISSL.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry


class Engine(abc.ABC):
    """Base class of engines."""

    @abc.abstractmethod
    def run_engine(
        self,
        cfg: Any,
        dist_run_id: str,
        checkpoint_path: str | None,
        checkpoint_folder: str,
        local_rank: int,
        node_id: int,
        hook_generator: Callable[[Any], list[Any]],
    ) -> Any:
        """Run the engine in this process."""


ENGINE_REGISTRY: Registry[Any] = Registry("engine", config_key="engine_name", base=Engine)


def register_engine(name: str) -> Any:
    """Decorator registering an :class:`Engine` subclass under ``name``."""
    return ENGINE_REGISTRY.register(name)


def get_engine(name: str) -> Engine:
    """An instance of the engine registered as ``name``."""
    return ENGINE_REGISTRY.get(name)()  # type: ignore[no-any-return]


def run_engine(
    engine_name: str,
    cfg: Any,
    dist_run_id: str,
    checkpoint_path: str | None,
    checkpoint_folder: str,
    local_rank: int = 0,
    node_id: int = 0,
    hook_generator: Callable[[Any], list[Any]] | None = None,
) -> Any:
    """Look up ``engine_name`` and run it (VISSL's signature)."""
    from vissl.hooks import default_hook_generator

    engine = get_engine(engine_name)
    return engine.run_engine(
        cfg,
        dist_run_id,
        checkpoint_path,
        checkpoint_folder,
        local_rank,
        node_id,
        hook_generator or default_hook_generator,
    )


import_submodules(__name__)

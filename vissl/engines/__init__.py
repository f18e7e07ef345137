"""Engines: ``@register_engine(name)`` classes selected by the root key ``engine_name``.

An engine subclasses :class:`Engine` and implements ``run_engine(ctx)``, where ``ctx`` is
the process's :class:`~vissl.engines.run_context.RunContext`. Engines written for VISSL,
``run_engine(cfg, dist_run_id, checkpoint_path, checkpoint_folder, local_rank, node_id,
hook_generator)``, keep working: they are called with those seven arguments.
"""

from __future__ import annotations

import abc
import inspect
from typing import Any

from vissl.engines.run_context import HookGenerator, RunContext
from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry


class Engine(abc.ABC):
    """Base class of engines."""

    @abc.abstractmethod
    def run_engine(self, ctx: RunContext) -> Any:
        """Run the engine in this process (the process group, if any, is initialised)."""


ENGINE_REGISTRY: Registry[Any] = Registry("engine", config_key="engine_name", base=Engine)


def register_engine(name: str) -> Any:
    """Decorator registering an :class:`Engine` subclass under ``name``."""
    return ENGINE_REGISTRY.register(name)


def get_engine(name: str) -> Engine:
    """An instance of the engine registered as ``name``."""
    return ENGINE_REGISTRY.get(name)()  # type: ignore[no-any-return]


def _takes_vissl_arguments(engine: Engine) -> bool:
    """Whether ``engine.run_engine`` has VISSL's seven-argument signature."""
    try:
        params = inspect.signature(engine.run_engine).parameters
    except (TypeError, ValueError):
        return False
    return len(params) > 1


def run_engine_in_context(ctx: RunContext) -> Any:
    """Look up ``ctx.engine_name`` and run it in this process."""
    engine = get_engine(ctx.engine_name)
    if _takes_vissl_arguments(engine):
        return engine.run_engine(  # type: ignore[call-arg]
            ctx.cfg,
            ctx.run_id,
            ctx.checkpoint_path,
            ctx.checkpoint_folder,
            ctx.local_rank,
            ctx.node_id,
            ctx.hook_generator,
        )
    return engine.run_engine(ctx)


def run_engine(
    engine_name: str,
    cfg: Any,
    dist_run_id: str,
    checkpoint_path: str | None,
    checkpoint_folder: str,
    local_rank: int = 0,
    node_id: int = 0,
    hook_generator: HookGenerator | None = None,
) -> Any:
    """VISSL's signature of :func:`run_engine_in_context`."""
    from vissl.hooks import default_hook_generator

    ctx = RunContext(
        cfg=cfg,
        engine_name=engine_name,
        run_id=dist_run_id,
        checkpoint_folder=checkpoint_folder,
        hook_generator=hook_generator or default_hook_generator,
        checkpoint_path=checkpoint_path,
        local_rank=local_rank,
        node_id=node_id,
    )
    return run_engine_in_context(ctx)


__all__ = [
    "ENGINE_REGISTRY",
    "Engine",
    "RunContext",
    "get_engine",
    "register_engine",
    "run_engine",
    "run_engine_in_context",
]

import_submodules(__name__)

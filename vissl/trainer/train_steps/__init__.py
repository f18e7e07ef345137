"""Train steps: registered by name, selected by ``TRAINER.TRAIN_STEP_NAME``.

A train step is either a function ``step(task) -> task`` (VISSL style) or a class whose
instances are callable that way (the standard step is a class of small section methods,
so a custom step can subclass it and override one section)::

    from vissl.trainer.train_steps import register_train_step, get_train_step

    @register_train_step("my_step")
    def my_step(task):
        task = get_train_step("standard_train_step")(task)  # wrap the standard step
        ...
        return task

``get_train_step(name)`` returns a callable ``task -> task`` for both kinds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry

TrainStep = Callable[[Any], Any]

TRAIN_STEP_REGISTRY: Registry[Any] = Registry(
    "train step", config_key="config.TRAINER.TRAIN_STEP_NAME"
)


def register_train_step(name: str) -> Callable[[Any], Any]:
    """Decorator registering a train-step function or class under ``name``."""

    def decorator(obj: Any) -> Any:
        if isinstance(obj, type):
            if not any("__call__" in vars(klass) for klass in obj.__mro__[:-1]):
                raise TypeError(
                    f"train step class {obj.__qualname__} must define __call__(self, task) -> task"
                )
        elif not callable(obj):
            raise TypeError(f"train step {name!r} must be a function or a class, got {obj!r}")
        return TRAIN_STEP_REGISTRY.register(name)(obj)

    return decorator


def get_train_step(name: str, **kwargs: Any) -> TrainStep:
    """Return the train step ``name`` as a callable ``task -> task``.

    Classes are instantiated with ``kwargs``; functions get ``kwargs`` bound by keyword.

    Raises:
        UnknownNameError: naming the registered train steps and the closest match.
    """
    obj = TRAIN_STEP_REGISTRY.get(name)
    if isinstance(obj, type):
        return obj(**kwargs)  # type: ignore[no-any-return]
    return functools.partial(obj, **kwargs) if kwargs else obj  # type: ignore[no-any-return]


import_submodules(__name__)

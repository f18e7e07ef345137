"""The transform registry: ``@register_transform(name)`` and ``get_transform(name)``.

A name that is not registered is looked up in ``torchvision.transforms`` (also in title
case, so ``random_horizontal_flip`` finds ``RandomHorizontalFlip``). This module sits below
every other module of :mod:`vissl.data.ssl_transforms` (it imports none of them), so the
sample wrappers can look names up without importing the package.
"""

from __future__ import annotations

from typing import Any

from vissl.utils.registry import Registry

TRANSFORM_REGISTRY: Registry[Any] = Registry(
    "transform", config_key="config.DATA.<split>.TRANSFORMS[].name"
)


def _torchvision_transform(name: str) -> Any:
    """``torchvision.transforms.<name>`` (or its title-cased form), if it is a class."""
    import torchvision.transforms as tv_transforms

    if not name or name.startswith("_"):
        return None
    for candidate in (name, name.title().replace("_", "")):
        obj = getattr(tv_transforms, candidate, None)
        if isinstance(obj, type) and obj.__module__.startswith("torchvision."):
            return obj
    return None


def _torchvision_transform_names() -> list[str]:
    import torchvision.transforms as tv_transforms

    return sorted(
        name
        for name, obj in vars(tv_transforms).items()
        if isinstance(obj, type)
        and obj.__module__.startswith("torchvision.")
        and not name.startswith("_")
    )


TRANSFORM_REGISTRY.add_fallback(
    _torchvision_transform,
    _torchvision_transform_names,
    "every class of torchvision.transforms (e.g. 'RandomResizedCrop') by name",
)


def register_transform(name: str) -> Any:
    """Decorator registering a transform class under ``name``."""
    return TRANSFORM_REGISTRY.register(name)


def get_transform(name: str) -> Any:
    """The transform class registered as ``name``, or the torchvision one.

    Raises:
        UnknownNameError: if neither vissl nor torchvision has it.
    """
    return TRANSFORM_REGISTRY.get(name)

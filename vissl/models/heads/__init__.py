"""Model heads: ``@register_model_head(name)`` classes built as ``cls(model_config, **kwargs)``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from vissl.config.params import parse
from vissl.utils.imports import import_submodules
from vissl.utils.registry import Registry

#: Where the heads and their arguments are configured.
HEAD_KEY = "config.MODEL.HEAD.PARAMS"
MODEL_HEADS_REGISTRY: Registry[Any] = Registry("model head", config_key=HEAD_KEY)
P = TypeVar("P")


def register_model_head(name: str) -> Any:
    """Decorator registering a head class under ``name`` (used in MODEL.HEAD.PARAMS)."""
    return MODEL_HEADS_REGISTRY.register(name)


def get_model_head(name: str) -> Any:
    return MODEL_HEADS_REGISTRY.get(name)


def parse_head(params_cls: type[P], name: str, arguments: Mapping[str, Any]) -> P:
    """A head's arguments read into its parameter dataclass
    (:func:`vissl.config.params.parse`: types and ranges, one wording); errors name
    ``config.MODEL.HEAD.PARAMS[<name>].<argument>``. The head's signature takes the
    defaults from the dataclass, so they are stated once."""
    return parse(params_cls, arguments, f"{HEAD_KEY}[{name}]")


import_submodules(__name__)

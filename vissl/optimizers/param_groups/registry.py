"""VISSL's import path of the param-group constructor registry
(``from vissl.optimizers.param_groups.registry import register_param_group_constructor``)."""

from __future__ import annotations

from vissl.optimizers.param_groups import (
    PARAM_GROUP_CONSTRUCTOR_REGISTRY,
    get_param_group_constructor,
    register_param_group_constructor,
)

__all__ = [
    "PARAM_GROUP_CONSTRUCTOR_REGISTRY",
    "get_param_group_constructor",
    "register_param_group_constructor",
]

"""``build_loss``: a loss module from the LOSS section of the config.

``LOSS.name`` is looked up in :data:`vissl.losses.LOSS_REGISTRY`; a name that is not
registered falls back to the ``torch.nn`` loss class of that name (``CrossEntropyLoss``,
``MSELoss``, ...), as in VISSL. Parameters come from ``LOSS.<name>``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.config.derive import derive_params, infer_loss_config
from vissl.errors import ConfigError, UnknownNameError
from vissl.losses import LOSS_REGISTRY

# Constructor arguments of torch losses that must be tensors, not lists.
_TENSOR_KWARGS = ("weight", "pos_weight")


def _is_torch_loss_class(obj: object) -> bool:
    return (
        isinstance(obj, type)
        and issubclass(obj, nn.Module)
        and obj.__name__.endswith("Loss")
        and not obj.__name__.startswith("_")
    )


def torch_loss_names() -> list[str]:
    """Names of the ``torch.nn`` loss classes accepted as ``LOSS.name``."""
    return sorted(name for name, obj in vars(nn.modules.loss).items() if _is_torch_loss_class(obj))


def _resolve_torch_loss(name: str) -> Any:
    obj = getattr(nn.modules.loss, name, None)
    return obj if _is_torch_loss_class(obj) else None


LOSS_REGISTRY.add_fallback(_resolve_torch_loss, torch_loss_names, "every torch.nn loss class")

__all__ = ["build_loss", "derive_params", "infer_loss_config", "torch_loss_names"]


def _loss_params(loss_config: Mapping[str, Any], name: str) -> AttrDict:
    params = loss_config.get(name)
    if params is None:
        return AttrDict()
    if not isinstance(params, Mapping):
        raise ConfigError(
            f"config.LOSS.{name} must be a mapping of the loss parameters, got {params!r}.",
            f"config.LOSS.{name}",
        )
    return params if isinstance(params, AttrDict) else AttrDict(params)


def _build_torch_loss(cls: type[nn.Module], name: str, params: AttrDict) -> nn.Module:
    kwargs = dict(params.to_dict())
    for key in _TENSOR_KWARGS:
        if isinstance(kwargs.get(key), list | tuple):
            kwargs[key] = torch.tensor(kwargs[key], dtype=torch.float32)
    accepted = inspect.signature(cls).parameters
    unknown = sorted(k for k in kwargs if k not in accepted)
    if unknown:
        raise ConfigError(
            f"config.LOSS.{name}: torch.nn.{name} does not accept {unknown}; "
            f"its arguments are {sorted(k for k in accepted if k not in ('args', 'kwargs'))}.",
            f"config.LOSS.{name}.{unknown[0]}",
        )
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"config.LOSS.{name}: cannot build torch.nn.{name}({kwargs}): {err}",
            f"config.LOSS.{name}",
        ) from err


def build_loss(
    loss_config: Mapping[str, Any], config: Mapping[str, Any] | None = None
) -> nn.Module:
    """Build the loss selected by ``LOSS.name``.

    Args:
        loss_config: the ``config.LOSS`` section: ``name`` plus one block of parameters
            per loss, ``LOSS.<name>``.
        config: the whole ``config`` section. When given, the loss is built from its
            block with what it infers from the rest of the config (:func:`derive_params`:
            crops from the transforms, prototypes from the head, queue lengths from the
            batch size). Neither argument is changed: the config stage has already written
            the derived values into the config (:func:`infer_loss_config`).

    Returns:
        The loss module. Registered classes with a ``from_config(cls, cfg)`` classmethod
        receive ``LOSS.<name>``; other registered classes and ``torch.nn`` losses get
        ``LOSS.<name>`` as keyword arguments.

    Raises:
        ConfigError: when ``LOSS.name`` is missing or the parameters are invalid.
        UnknownNameError: when the name is neither registered nor a ``torch.nn`` loss.
    """
    if loss_config is None or not loss_config.get("name"):
        raise ConfigError(
            "config.LOSS.name is not set: name a registered loss "
            f"({LOSS_REGISTRY.names()}) or a torch.nn loss class such as 'CrossEntropyLoss'.",
            "config.LOSS.name",
        )
    name = loss_config["name"]
    if not isinstance(name, str):
        raise ConfigError(f"config.LOSS.name must be a string, got {name!r}.", "config.LOSS.name")
    try:
        cls = LOSS_REGISTRY.get(name)
    except UnknownNameError as err:
        raise UnknownNameError(
            f"{err} Any torch.nn loss class is also accepted by its class name, e.g. "
            f"{', '.join(torch_loss_names()[:6])}, ..."
        ) from None
    params = _loss_params(loss_config, name)
    if name not in LOSS_REGISTRY:
        return _build_torch_loss(cls, name, params)
    params = derive_params(cls, params, config)
    from_config = getattr(cls, "from_config", None)
    if callable(from_config):
        loss = from_config(params)
    else:
        loss = cls(**params)
    if not isinstance(loss, nn.Module):
        raise TypeError(
            f"loss {name!r} ({LOSS_REGISTRY.origin(name)}) built {type(loss).__name__}, "
            "expected a torch.nn.Module."
        )
    return loss

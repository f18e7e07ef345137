"""``build_meters``: the meters listed in the METERS section of the config."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.meters import METER_REGISTRY


def meter_names_from_config(meters_config: Mapping[str, Any] | None) -> list[str]:
    """The meter names of ``METERS.names`` plus the deprecated ``METERS.name``, in order."""
    if not meters_config:
        return []
    names = meters_config.get("names") or []
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f"config.METERS.names must be a list of meter names, got {names!r}.",
            "config.METERS.names",
        )
    names = [n for n in names if n]
    single = meters_config.get("name")
    if single:
        if not isinstance(single, str):
            raise ConfigError(
                f"config.METERS.name must be a meter name, got {single!r}.", "config.METERS.name"
            )
        warnings.warn(
            "config.METERS.name is deprecated; list the meter in config.METERS.names.",
            DeprecationWarning,
            stacklevel=3,
        )
        if single not in names:
            names.append(single)
    return names


def _takes_device(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "device" in params


def build_meters(
    meters_config: Mapping[str, Any] | None, device: torch.device | str | None = None
) -> list[Any]:
    """Build every meter named by ``METERS.names`` (or the deprecated ``METERS.name``).

    Args:
        meters_config: the ``config.METERS`` section (``None`` or empty: no meters). Each
            meter's parameters come from ``METERS.<name>``.
        device: where the meters keep their state (the task's device; default CPU). NCCL
            all-reduces only GPU tensors, so a meter synced at phase end must hold its
            counters there even if it never saw a batch. Passed to meters whose
            ``from_config`` (or constructor) takes a ``device`` argument.

    Returns:
        The meters, in the order of the names.

    Raises:
        UnknownNameError: a name that no meter is registered under.
        ConfigError: invalid meter parameters.
    """
    device = torch.device("cpu" if device is None else device)
    meters = []
    for name in meter_names_from_config(meters_config):
        cls = METER_REGISTRY.get(name)
        params = (meters_config or {}).get(name)
        if params is not None and not isinstance(params, Mapping):
            raise ConfigError(
                f"config.METERS.{name} must be a mapping of the meter parameters, got {params!r}.",
                f"config.METERS.{name}",
            )
        params = AttrDict(params or {})
        from_config = getattr(cls, "from_config", None)
        if callable(from_config):
            extra = {"device": device} if _takes_device(from_config) else {}
            meters.append(from_config(params, **extra))
        else:
            extra = {"device": device} if "device" not in params and _takes_device(cls) else {}
            meters.append(cls(**params, **extra))
    return meters

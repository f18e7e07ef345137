"""Validation of optimizer and scheduler config values, raising ``ConfigError`` with key paths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from vissl.config.params import Range, check_value
from vissl.errors import ConfigError

_MISSING = object()


def is_number(value: Any) -> bool:
    """True for ints and floats, not bools."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def get_number(
    cfg: Mapping[str, Any],
    key: str,
    path: str,
    *,
    default: Any = _MISSING,
    min_value: float | None = None,
    max_value: float | None = None,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
) -> float:
    """``cfg[key]`` checked to be a number in range; ``path`` is the key path of ``cfg``
    (the checks and wording of :func:`vissl.config.params.check_value`).

    Raises:
        ConfigError: naming ``path.key`` when it is missing (with no default), not a
            number or out of range.
    """
    full = f"{path}.{key}"
    value = cfg.get(key, default) if isinstance(cfg, Mapping) else default
    if value is _MISSING:
        raise ConfigError(f"{full} is required.", full)
    bounds = Range(
        low=min_value, high=max_value, low_open=not min_inclusive, high_open=not max_inclusive
    )
    number: float = check_value(value, Annotated[int | float, bounds], full)
    return number


def get_bool(cfg: Mapping[str, Any], key: str, path: str, *, default: bool = False) -> bool:
    """``cfg[key]`` checked to be a bool (``default`` when absent or ``None``)."""
    full = f"{path}.{key}"
    value = cfg.get(key) if isinstance(cfg, Mapping) else None
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{full} must be true or false, got {value!r}.", full)
    return value


def get_section(cfg: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    """``cfg[key]`` as a mapping (empty when absent or ``None``)."""
    value = cfg.get(key) if isinstance(cfg, Mapping) else None
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}.{key} must be a mapping, got {value!r}.", f"{path}.{key}")
    return value

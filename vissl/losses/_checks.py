"""Typed checks of a loss's config values, each raising a ConfigError with the key path."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, TypeVar

from vissl.errors import ConfigError

T = TypeVar("T")


def build_from_params(cls: type[T], params: Mapping[str, Any], root: str) -> T:
    """``cls(**params)``, after refusing a key its constructor does not take (the error
    names ``root.<key>`` and the keys it takes)."""
    known = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(
            f"{root} has no key(s) {unknown}; its keys are {sorted(known)}.",
            f"{root}.{unknown[0]}",
        )
    return cls(**dict(params))


def is_number(value: Any) -> bool:
    """An int or float (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


class KeyChecks:
    """Checks of the values under one config block (``root``, e.g. ``config.LOSS.x``)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _fail(self, key: str, what: str, value: Any) -> ConfigError:
        path = f"{self.root}.{key}"
        return ConfigError(f"{path} must be {what}, got {value!r}.", path)

    def positive(self, value: Any, key: str) -> float:
        if not is_number(value) or value <= 0:
            raise self._fail(key, "a number > 0", value)
        return float(value)

    def non_negative(self, value: Any, key: str) -> float:
        if not is_number(value) or value < 0:
            raise self._fail(key, "a number >= 0", value)
        return float(value)

    def unit(self, value: Any, key: str, upper_open: bool = False) -> float:
        """A number in [0, 1] (or [0, 1) with ``upper_open``)."""
        if not is_number(value) or not (0 <= value < 1 if upper_open else 0 <= value <= 1):
            raise self._fail(key, f"a number in {'[0, 1)' if upper_open else '[0, 1]'}", value)
        return float(value)

    def count(self, value: Any, key: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self._fail(key, f"an integer >= {minimum}", value)
        return value

    def flag(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self._fail(key, "true or false", value)
        return value

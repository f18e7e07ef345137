"""Typed checks of a loss's config values, each raising a ConfigError with the key path.

A thin layer over :mod:`vissl.config.params` for the losses that do not declare a
``Params`` dataclass yet: the same checks and the same wording. New code declares its
parameters as a dataclass and calls :func:`vissl.config.params.parse`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from vissl.config.params import IntAtLeast, NonNegative, Positive, Unit, UnitOpen, check_value
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

    def _check(self, value: Any, tp: Any, key: str) -> Any:
        return check_value(value, tp, f"{self.root}.{key}")

    def positive(self, value: Any, key: str) -> float:
        return float(self._check(value, Annotated[float, Positive], key))

    def non_negative(self, value: Any, key: str) -> float:
        return float(self._check(value, Annotated[float, NonNegative], key))

    def unit(self, value: Any, key: str, upper_open: bool = False) -> float:
        """A number in [0, 1] (or [0, 1) with ``upper_open``)."""
        return float(self._check(value, Annotated[float, UnitOpen if upper_open else Unit], key))

    def count(self, value: Any, key: str, minimum: int = 0) -> int:
        return int(self._check(value, Annotated[int, IntAtLeast(minimum)], key))

    def flag(self, value: Any, key: str) -> bool:
        return bool(self._check(value, bool, key))

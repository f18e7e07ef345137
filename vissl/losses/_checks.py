"""``build_from_params``, for the one loss (nnclr) that does not declare a ``Params``
dataclass yet. New code declares its parameters as a dataclass and calls
:func:`vissl.config.params.parse`.
"""

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

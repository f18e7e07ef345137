"""Typed component parameters: each component declares its config block once.

A component (a loss, an optimizer, a trunk, a head) declares the keys of its config block
as a frozen dataclass, with the type of each key and, where the type is not enough, a
constraint marker::

    @dataclass(kw_only=True, frozen=True)
    class SimclrParams:
        temperature: Annotated[float, Positive] = 0.1
        buffer_params: BufferParams = field(default_factory=BufferParams)

:func:`parse` then reads a mapping (``config.LOSS.simclr_info_nce_loss``) into that
dataclass, with one set of checks and one wording for every component:

- a key the dataclass does not declare is refused (:class:`~vissl.errors.UnknownKeyError`),
  naming its dotted key path, the closest valid key and every valid key;
- a missing key takes the dataclass's default (a key without a default is required);
- each value is checked against its type (``bool``, ``int``, ``float``, ``str``,
  ``X | None``, ``list[X]``, ``tuple[X, ...]``, ``dict[str, X]``, a nested dataclass,
  ``Literal``) and its markers (:data:`Positive`, :data:`NonNegative`, :data:`Unit`,
  :data:`UnitOpen`, :func:`IntAtLeast`, :class:`Range`, :class:`OneOf`), and the error
  names the key path, the expected kind and the value given;
- an ``int`` given for a ``float`` key becomes a ``float``; ``bool`` is never a number;
- a dataclass may define ``check(self, key_path: str) -> None`` for the rules that tie
  several keys together; it runs after every key has been read.

The components build from the parsed dataclass (``cls(**vars(parse(cls.Params, cfg,
key)))``), so every default lives in one place and the messages cannot drift.
Anchors: torchtitan's ``Configurable.Config``; detectron2's ``@configurable``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from vissl.errors import ConfigError, UnknownKeyError

__all__ = [
    "Finite",
    "IntAtLeast",
    "Length",
    "NonEmpty",
    "NonNegative",
    "Note",
    "OneOf",
    "Positive",
    "Range",
    "Unit",
    "UnitOpen",
    "as_dict",
    "check_value",
    "describe",
    "keys_of",
    "parse",
]

P = TypeVar("P")


class Constraint:
    """A rule on a value that its type already admits (a range, a set of choices)."""

    def ok(self, value: Any) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError


@dataclass(frozen=True)
class Range(Constraint):
    """``low <= value <= high`` (``low_open`` / ``high_open``: strict); ``None``: no bound."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def ok(self, value: Any) -> bool:
        if isinstance(value, float) and math.isnan(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None:
            return not (value >= self.high if self.high_open else value > self.high)
        return True

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            left = "(" if self.low_open else "["
            right = ")" if self.high_open else "]"
            return f"in {left}{_num(self.low)}, {_num(self.high)}{right}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {_num(self.high)}"
        return ""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


#: A number > 0.
Positive = Range(low=0, low_open=True)
#: A number >= 0.
NonNegative = Range(low=0)
#: A number in [0, 1].
Unit = Range(low=0, high=1)
#: A number in [0, 1) (a rate or probability where 1 is meaningless).
UnitOpen = Range(low=0, high=1, high_open=True)


class _Finite(Constraint):
    """Not infinite and not NaN (use with ``float``)."""

    def ok(self, value: Any) -> bool:
        return math.isfinite(value)

    def describe(self) -> str:
        return ""

    def __repr__(self) -> str:
        return "Finite"


#: A finite number (not inf, not NaN): ``Annotated[float, Finite, NonNegative]``.
Finite = _Finite()


@dataclass(frozen=True)
class Length(Constraint):
    """A list of exactly ``n`` entries (``n`` at least, with ``at_least``)."""

    n: int
    at_least: bool = False

    def ok(self, value: Any) -> bool:
        return len(value) >= self.n if self.at_least else len(value) == self.n

    def describe(self) -> str:
        return ""


#: A list with at least one entry.
NonEmpty = Length(1, at_least=True)


@dataclass(frozen=True)
class Note:
    """Why a key has its rule, shown in parentheses after the expectation in errors:
    ``Annotated[int, IntAtLeast(2), Note("2 large crops, then the small ones")]``."""

    text: str


def IntAtLeast(minimum: int) -> Range:
    """An integer >= ``minimum`` (use with ``int``: ``Annotated[int, IntAtLeast(1)]``)."""
    return Range(low=minimum)


class OneOf(Constraint):
    """One of the given values (compared with ``==``)."""

    def __init__(self, *choices: Any) -> None:
        self.choices = tuple(choices)

    def ok(self, value: Any) -> bool:
        return any(value == c and type(value) is type(c) for c in self.choices)

    def describe(self) -> str:
        return f"one of {list(self.choices)}"

    def __repr__(self) -> str:
        return f"OneOf{self.choices!r}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OneOf) and other.choices == self.choices

    def __hash__(self) -> int:
        return hash(self.choices)


# ---------------------------------------------------------------------- type handling
_NONE = type(None)


def _hints(cls: type) -> dict[str, Any]:
    module = sys.modules.get(cls.__module__)
    globalns = dict(vars(module)) if module is not None else {}
    return typing.get_type_hints(cls, globalns=globalns, include_extras=True)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _is_params(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def describe(tp: Any) -> str:
    """What a value of type ``tp`` is, in words ("an integer >= 1", "null or a number")."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return "any value"
    if origin is typing.Annotated:
        inner, *marks = typing.get_args(tp)
        base = describe(inner)
        if any(m is Finite for m in marks):
            base = base.replace("a number", "a finite number")
        for m in marks:
            if isinstance(m, Length) and base.startswith("a list of "):
                count = f"at least {m.n}" if m.at_least else str(m.n)
                base = (
                    "a non-empty list of " + base[len("a list of ") :]
                    if m.at_least and m.n == 1
                    else f"a list of {count} {base[len('a list of ') :]}"
                )
        words = [base]
        for m in marks:
            if isinstance(m, OneOf):
                return m.describe()
            if isinstance(m, Constraint) and m.describe():
                words.append(m.describe())
        notes = [m.text for m in marks if isinstance(m, Note)]
        return " ".join(words) + "".join(f" ({n})" for n in notes)
    if _is_union(tp):
        args = typing.get_args(tp)
        if set(args) - {_NONE} == {int, float}:  # "an integer or a number" says less
            return "null or a number" if _NONE in args else "a number"
        parts = [describe(a) for a in args if a is not _NONE]
        text = " or ".join(parts)
        return f"null or {text}" if _NONE in args else text
    if origin is typing.Literal:
        return f"one of {list(typing.get_args(tp))}"
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        elems = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if origin is tuple and len(elems) > 1 and Ellipsis not in typing.get_args(tp):
            return f"a list of {len(elems)} values ({', '.join(describe(a) for a in elems)})"
        return f"a list of {_plural(describe(elems[0]))}" if elems else "a list"
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return "a mapping"
    if _is_params(tp):
        return f"a mapping of {keys_of(tp)}"
    return getattr(tp, "__name__", str(tp))


def _plural(words: str) -> str:
    for article in ("an ", "a "):
        if words.startswith(article):
            head, _, rest = words[len(article) :].partition(" ")
            return f"{head}s{' ' + rest if rest else ''}"
    return words


class _Mismatch(Exception):
    """A value that does not fit a type; ``path`` and ``value`` say where and what."""

    def __init__(self, path: str, tp: Any, value: Any) -> None:
        super().__init__(path)
        self.path, self.tp, self.value = path, tp, value


def check_value(value: Any, tp: Any, path: str) -> Any:
    """``value`` checked against ``tp`` (and its markers), converted where the type says
    (an ``int`` for a ``float``, a list for a ``tuple``, a mapping for a dataclass).

    Raises:
        ConfigError: naming ``path`` (or the path of the element at fault), what is
            expected and the value given.
    """
    try:
        return _check(value, tp, path)
    except _Mismatch as err:
        raise ConfigError(
            f"{err.path} must be {describe(err.tp)}, got {err.value!r}.", err.path
        ) from None


def _check(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is typing.Annotated:
        inner, *marks = typing.get_args(tp)
        try:
            out = _check(value, inner, path)
        except _Mismatch as err:
            if err.path != path:
                raise
            raise _Mismatch(path, tp, value) from None
        if out is not None:
            for m in marks:
                if isinstance(m, Constraint) and not m.ok(out):
                    raise _Mismatch(path, tp, value)
        return out
    if _is_union(tp):
        args = typing.get_args(tp)
        if value is None and _NONE in args:
            return None
        for arg in args:
            if arg is _NONE:
                continue
            try:
                return _check(value, arg, path)
            except _Mismatch as err:
                if err.path != path:  # an element deeper down: its own message is better
                    raise
        raise _Mismatch(path, tp, value)
    if origin is typing.Literal:
        choices = typing.get_args(tp)
        if not OneOf(*choices).ok(value):
            raise _Mismatch(path, tp, value)
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise _Mismatch(path, tp, value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Mismatch(path, tp, value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Mismatch(path, tp, value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _Mismatch(path, tp, value)
        return value
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
            raise _Mismatch(path, tp, value)
        args = typing.get_args(tp)
        if origin is tuple and args and Ellipsis not in args:
            if len(value) != len(args):
                raise _Mismatch(path, tp, value)
            items = [_check(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args))]
        else:
            elem = args[0] if args else Any
            items = [_check(v, elem, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple or tp is tuple else items
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise _Mismatch(path, tp, value)
        args = typing.get_args(tp)
        if not args or args[1] is Any:
            return value
        return {k: _check(v, args[1], f"{path}.{k}") for k, v in value.items()}
    if _is_params(tp):
        if not isinstance(value, Mapping):
            raise _Mismatch(path, tp, value)
        return parse(tp, value, path)
    if isinstance(tp, type):
        if not isinstance(value, tp):
            raise _Mismatch(path, tp, value)
        return value
    raise TypeError(f"vissl.config.params cannot check values of type {tp!r} ({path})")


# ---------------------------------------------------------------------- the parser
def keys_of(params_cls: type) -> list[str]:
    """The keys a parameter dataclass declares, sorted."""
    return sorted(f.name for f in dataclasses.fields(params_cls))


def _unknown_key_error(key_path: str, unknown: Sequence[str], valid: list[str]) -> UnknownKeyError:
    first = unknown[0]
    close = difflib.get_close_matches(first, valid, n=1, cutoff=0.6)
    hint = f" Did you mean {key_path}.{close[0]}?" if close else ""
    shown = ", ".join(repr(k) for k in unknown)
    return UnknownKeyError(
        f"{key_path} has no key(s) [{shown}].{hint} Its keys are {valid}.",
        f"{key_path}.{first}",
    )


def parse(
    params_cls: type[P], mapping: Mapping[str, Any] | None, key_path: str, *, shared: bool = False
) -> P:
    """Read ``mapping`` (the config block at ``key_path``) into ``params_cls``.

    Args:
        params_cls: a dataclass whose fields are the block's keys (see the module
            docstring for the types and markers it understands).
        mapping: the block; ``None`` means empty (every key at its default).
        key_path: the block's dotted path in the config (``config.LOSS.barlow_twins_loss``),
            used in every error.
        shared: the mapping is a section several components read (``config.OPTIMIZER``,
            whose keys the config validation checks): keys ``params_cls`` does not
            declare are left to the others instead of refused.

    Returns:
        The dataclass, every value checked (and converted where its type says).

    Raises:
        UnknownKeyError: a key ``params_cls`` does not declare (the message lists the
            valid keys and the closest one).
        ConfigError: a required key is missing, a value has the wrong type or is out of
            range, or the dataclass's own ``check`` refuses the combination.
    """
    if not _is_params(params_cls):
        raise TypeError(f"{params_cls!r} is not a dataclass")
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{key_path} must be {describe(params_cls)}, got {mapping!r}.", key_path)
    fields = {f.name: f for f in dataclasses.fields(params_cls) if f.init}  # type: ignore[arg-type]
    valid = sorted(fields)
    unknown = [] if shared else sorted(str(k) for k in mapping if k not in fields)
    if unknown:
        raise _unknown_key_error(key_path, unknown, valid)
    hints = _hints(params_cls)
    values: dict[str, Any] = {}
    for name, f in fields.items():
        path = f"{key_path}.{name}"
        tp = hints[name]
        if name in mapping:
            value = mapping[name]
            if value is None and _is_params(tp):
                value = {}
            values[name] = check_value(value, tp, path)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{path} is required: {describe(tp)}.", path)
    params = params_cls(**values)
    check = getattr(params, "check", None)
    if callable(check):
        check(key_path)
    return params


def as_dict(params: Any) -> dict[str, Any]:
    """The parameters as a plain nested mapping (the config block they parse from)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = as_dict(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out

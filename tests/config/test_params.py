"""vissl.config.params: one parser for every component's config block."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import pytest

from vissl.config.attr_dict import AttrDict
from vissl.config.params import (
    Finite,
    IntAtLeast,
    Length,
    NonEmpty,
    NonNegative,
    Note,
    OneOf,
    Positive,
    Range,
    Unit,
    UnitOpen,
    as_dict,
    describe,
    keys_of,
    parse,
)
from vissl.errors import ConfigError, UnknownKeyError

KEY = "config.LOSS.toy"


@dataclass(kw_only=True, frozen=True)
class Buffer:
    embedding_dim: Annotated[int, IntAtLeast(1)] | None = None
    world_size: int | None = None


@dataclass(kw_only=True, frozen=True)
class Toy:
    temperature: Annotated[float, Positive] = 0.1
    momentum: Annotated[float, Unit] = 0.5
    drop: Annotated[float, UnitOpen] = 0.0
    weight: Annotated[float, NonNegative] = 1.0
    coeff: Annotated[float, Finite, NonNegative] = 1.0
    num_crops: Annotated[int, IntAtLeast(2), Note("2 large crops")] = 2
    mode: Annotated[str, OneOf("nce", "cross_entropy")] = "nce"
    kind: Literal["a", "b"] = "a"
    flag: bool = False
    dims: list[Annotated[int, IntAtLeast(1)]] = field(default_factory=lambda: [8, 4])
    pair: tuple[int, int] = (1, 2)
    extra: dict[str, Any] = field(default_factory=dict)
    buffer_params: Buffer = field(default_factory=Buffer)


def _err(mapping: dict[str, Any], cls: type = Toy) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(cls, mapping, KEY)
    return info.value


def test_defaults_come_from_the_dataclass() -> None:
    p = parse(Toy, {}, KEY)
    assert p == Toy()
    assert parse(Toy, None, KEY) == Toy()
    assert p.buffer_params == Buffer()


def test_values_are_read_and_converted() -> None:
    p = parse(
        Toy,
        AttrDict(
            {"temperature": 1, "dims": [3], "pair": [5, 6], "buffer_params": {"world_size": 4}}
        ),
        KEY,
    )
    assert p.temperature == 1.0 and isinstance(p.temperature, float)
    assert p.dims == [3]
    assert p.pair == (5, 6)
    assert p.buffer_params == Buffer(world_size=4)
    assert dataclasses.is_dataclass(p) and not isinstance(p, type)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 2.0  # type: ignore[misc]


def test_unknown_key_names_path_closest_and_valid_keys() -> None:
    err = _err({"temprature": 0.2})
    assert isinstance(err, UnknownKeyError)
    assert err.key_path == f"{KEY}.temprature"
    text = str(err)
    assert f"Did you mean {KEY}.temperature?" in text
    assert str(keys_of(Toy)) in text


def test_unknown_key_with_no_close_match_lists_all_unknown() -> None:
    err = _err({"zzz": 1, "yyy": 2})
    assert err.key_path == f"{KEY}.yyy"
    assert "'yyy', 'zzz'" in str(err)
    assert "Did you mean" not in str(err)


def test_unknown_key_in_a_nested_block_has_the_nested_path() -> None:
    err = _err({"buffer_params": {"embeding_dim": 3}})
    assert isinstance(err, UnknownKeyError)
    assert err.key_path == f"{KEY}.buffer_params.embeding_dim"
    assert f"Did you mean {KEY}.buffer_params.embedding_dim?" in str(err)
    assert "['embedding_dim', 'world_size']" in str(err)


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("temperature", "0.1", "a number > 0"),
        ("temperature", True, "a number > 0"),
        ("temperature", None, "a number > 0"),
        ("num_crops", 2.0, "an integer >= 2 (2 large crops)"),
        ("flag", 1, "true or false"),
        ("mode", 3, "one of ['nce', 'cross_entropy']"),
        ("dims", 8, "a list of integers >= 1"),
        ("dims", "8", "a list of integers >= 1"),
        ("extra", [1], "a mapping"),
        ("buffer_params", 3, "a mapping of ['embedding_dim', 'world_size']"),
    ],
)
def test_wrong_type_names_path_expectation_and_value(key: str, value: Any, expected: str) -> None:
    err = _err({key: value})
    assert err.key_path == f"{KEY}.{key}"
    assert str(err) == f"{KEY}.{key} must be {expected}, got {value!r}."


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("temperature", 0, "a number > 0"),
        ("temperature", -1.5, "a number > 0"),
        ("temperature", float("nan"), "a number > 0"),
        ("momentum", 1.5, "a number in [0, 1]"),
        ("momentum", -0.1, "a number in [0, 1]"),
        ("drop", 1, "a number in [0, 1)"),
        ("weight", -1, "a number >= 0"),
        ("coeff", float("inf"), "a finite number >= 0"),
        ("coeff", -1.0, "a finite number >= 0"),
        ("num_crops", 1, "an integer >= 2 (2 large crops)"),
        ("mode", "NCE", "one of ['nce', 'cross_entropy']"),
        ("kind", "c", "one of ['a', 'b']"),
    ],
)
def test_out_of_range(key: str, value: Any, expected: str) -> None:
    err = _err({key: value})
    assert err.key_path == f"{KEY}.{key}"
    assert str(err) == f"{KEY}.{key} must be {expected}, got {value!r}."


def test_bounds_are_inclusive_where_they_say_so() -> None:
    p = parse(Toy, {"momentum": 1, "drop": 0, "weight": 0, "num_crops": 2}, KEY)
    assert (p.momentum, p.drop, p.weight, p.num_crops) == (1.0, 0.0, 0.0, 2)


def test_element_errors_name_the_index() -> None:
    err = _err({"dims": [8, 0]})
    assert err.key_path == f"{KEY}.dims[1]"
    assert str(err) == f"{KEY}.dims[1] must be an integer >= 1, got 0."
    err = _err({"pair": [1]})
    assert err.key_path == f"{KEY}.pair"


def test_optional_accepts_none_and_checks_the_rest() -> None:
    assert parse(Toy, {"buffer_params": {"embedding_dim": None}}, KEY).buffer_params == Buffer()
    err = _err({"buffer_params": {"embedding_dim": 0}})
    assert err.key_path == f"{KEY}.buffer_params.embedding_dim"
    assert "must be null or an integer >= 1, got 0." in str(err)


def test_null_nested_block_means_its_defaults() -> None:
    assert parse(Toy, {"buffer_params": None}, KEY).buffer_params == Buffer()


@dataclass(kw_only=True, frozen=True)
class Required:
    size: Annotated[int, IntAtLeast(1)]
    scale: float = 1.0


def test_a_key_without_default_is_required() -> None:
    err = _err({}, Required)
    assert err.key_path == f"{KEY}.size"
    assert "is required" in str(err) and "an integer >= 1" in str(err)
    assert parse(Required, {"size": 3}, KEY) == Required(size=3)


@dataclass(kw_only=True, frozen=True)
class Crossed:
    low: float = 0.0
    high: float = 1.0

    def check(self, key_path: str) -> None:
        if self.low > self.high:
            raise ConfigError(f"{key_path}.low must be <= high", f"{key_path}.low")


def test_cross_key_check_runs_after_parsing() -> None:
    assert parse(Crossed, {"low": 0.5}, KEY).low == 0.5
    err = _err({"low": 2}, Crossed)
    assert err.key_path == f"{KEY}.low"


def test_block_that_is_not_a_mapping() -> None:
    err = _err([1, 2])  # type: ignore[arg-type]
    assert err.key_path == KEY


def test_not_a_dataclass_is_a_programming_error() -> None:
    with pytest.raises(TypeError):
        parse(dict, {}, KEY)


def test_as_dict_round_trips() -> None:
    p = parse(Toy, {"pair": [3, 4], "buffer_params": {"world_size": 2}}, KEY)
    d = as_dict(p)
    assert d["pair"] == [3, 4] and d["buffer_params"] == {"embedding_dim": None, "world_size": 2}
    assert parse(Toy, d, KEY) == p


def test_describe_and_range_words() -> None:
    assert describe(Annotated[float, Range(low=0, high=2, low_open=True)]) == "a number in (0, 2]"
    assert describe(Annotated[float, Range(high=5, high_open=True)]) == "a number < 5"
    assert describe(int | str) == "an integer or a string"
    assert describe(list[float] | None) == "null or a list of numbers"


def test_a_shared_section_leaves_other_keys_to_other_components() -> None:
    section = {"size": 2, "num_epochs": 10, "name": "sgd"}
    assert parse(Required, section, "config.OPTIMIZER", shared=True) == Required(size=2)
    with pytest.raises(UnknownKeyError):
        parse(Required, section, "config.OPTIMIZER")
    err = _err_shared({"size": 0, "name": "sgd"})
    assert err.key_path == "config.OPTIMIZER.size"


def _err_shared(mapping: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(Required, mapping, "config.OPTIMIZER", shared=True)
    return info.value


def test_int_or_float_keeps_the_number_as_given() -> None:
    @dataclass(kw_only=True, frozen=True)
    class Num:
        momentum: Annotated[int | float, UnitOpen] = 0.0

    assert type(parse(Num, {"momentum": 0}, KEY).momentum) is int
    assert describe(Annotated[int | float, UnitOpen]) == "a number in [0, 1)"
    assert str(_err({"momentum": 1}, Num)) == f"{KEY}.momentum must be a number in [0, 1), got 1."


def test_list_length() -> None:
    @dataclass(kw_only=True, frozen=True)
    class Stages:
        depths: Annotated[list[Annotated[int, IntAtLeast(1)]], Length(4)] = field(
            default_factory=lambda: [1, 1, 1, 1]
        )
        heads: Annotated[list[int], NonEmpty] = field(default_factory=lambda: [1])

    assert parse(Stages, {"depths": [2, 2, 6, 2]}, KEY).depths == [2, 2, 6, 2]
    err = _err({"depths": [3, 3, 3]}, Stages)
    assert str(err) == f"{KEY}.depths must be a list of 4 integers >= 1, got [3, 3, 3]."
    err = _err({"heads": []}, Stages)
    assert str(err) == f"{KEY}.heads must be a non-empty list of integers, got []."

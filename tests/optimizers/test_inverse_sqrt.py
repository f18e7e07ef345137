"""VISSL's ``inverse_sqrt`` scheduler against its formula, in composites, errors."""

from __future__ import annotations

import math

import pytest

from vissl.errors import ConfigError
from vissl.optimizers.param_scheduler import build_param_scheduler

PATH = "config.OPTIMIZER.param_schedulers.lr"


def _reference(where: float, start: float, warmup: float) -> float:
    if where < warmup:
        return start * where / warmup  # linear from 0
    return start * math.sqrt(warmup) / math.sqrt(where)


@pytest.mark.parametrize(("start", "warmup"), [(0.1, 0.1), (1.0, 0.25), (0.3, 1.0)])
def test_matches_the_formula(start: float, warmup: float) -> None:
    sched = build_param_scheduler(
        {"name": "inverse_sqrt", "start_value": start, "warmup_interval_length": warmup}
    )
    for i in range(200):
        where = i / 200
        assert sched(where) == pytest.approx(_reference(where, start, warmup), abs=1e-12)
    # continuous at the end of the warmup; the peak is start_value
    assert sched(warmup) == pytest.approx(start)
    assert sched(warmup - 1e-9) == pytest.approx(start, rel=1e-6)


def test_hand_computed_points() -> None:
    sched = build_param_scheduler(
        {"name": "inverse_sqrt", "start_value": 1.0, "warmup_interval_length": 0.25}
    )
    assert [sched(w) for w in (0.0, 0.125, 0.25, 1.0 - 1e-12)] == pytest.approx(
        [0.0, 0.5, 1.0, 0.5]
    )


def test_inside_composite_uses_the_local_where() -> None:
    sched = build_param_scheduler(
        {
            "name": "composite",
            "schedulers": [
                {"name": "constant", "value": 0.01},
                {"name": "inverse_sqrt", "start_value": 0.4, "warmup_interval_length": 0.5},
            ],
            "lengths": [0.5, 0.5],
            "interval_scaling": ["rescaled", "rescaled"],
        }
    )
    assert sched(0.25) == pytest.approx(0.01)
    for where in (0.5, 0.6, 0.75, 0.8, 0.99):
        assert sched(where) == pytest.approx(_reference((where - 0.5) / 0.5, 0.4, 0.5)), where


@pytest.mark.parametrize(
    ("cfg", "key"),
    [
        ({"start_value": 0.1, "warmup_interval_length": 0.0}, "warmup_interval_length"),
        ({"start_value": 0.1, "warmup_interval_length": 1.2}, "warmup_interval_length"),
        ({"start_value": 0.1}, "warmup_interval_length"),
        ({"warmup_interval_length": 0.1}, "start_value"),
        ({"start_value": 0.1, "warmup_interval_length": 0.1, "warmup": 3}, "warmup"),
    ],
)
def test_bad_values_name_the_key(cfg: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_param_scheduler({"name": "inverse_sqrt", **cfg})
    assert info.value.key_path == f"{PATH}.{key}"

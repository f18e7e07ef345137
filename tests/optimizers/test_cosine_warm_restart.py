"""VISSL's ``cosine_warm_restart`` scheduler against the SGDR formula, in composites, errors."""

from __future__ import annotations

import math

import pytest

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.optimizers import build_param_schedulers
from vissl.optimizers.param_scheduler import build_param_scheduler
from vissl.optimizers.param_scheduler.auto_lr_scaling import apply_auto_lr_scaling

WHERES = [i / 200 for i in range(200)] + [0.999999]


def _reference(
    where: float,
    start: float,
    end: float,
    length: float,
    wave: str = "half",
    multiplier: float = 1.0,
    adaptive: bool = False,
) -> float:
    """SGDR written out: walk the restarts up to ``where``, then one cosine (half or full)."""
    restarts = []
    r = 0.0
    while r < 1.0 - 1e-9:
        restarts.append(r)
        r = round(r + length, 12)
    k = 0
    while k + 1 < len(restarts) and restarts[k + 1] <= where + 1e-12:
        k += 1
    t = (where - restarts[k]) / length
    if adaptive:
        peak = end + (start - end) * (1 + math.cos(math.pi * restarts[k])) / 2
    else:
        peak = start
        for _ in range(k):
            peak *= multiplier
    periods = 1.0 if wave == "full" else 0.5
    return end + (peak - end) * (1 + math.cos(2 * math.pi * periods * t)) / 2


def _build(**kwargs: object):
    return build_param_scheduler({"name": "cosine_warm_restart", **kwargs})


@pytest.mark.parametrize(
    "params",
    [
        {"start_value": 0.1, "end_value": 0.0, "restart_interval_length": 0.25},
        {"start_value": 1.0, "end_value": 0.1, "restart_interval_length": 0.3},  # partial last
        {"start_value": 0.5, "end_value": 0.0, "restart_interval_length": 1.0},
        {
            "start_value": 1.0,
            "end_value": 0.0,
            "restart_interval_length": 0.2,
            "wave_type": "full",
        },
        {
            "start_value": 2.0,
            "end_value": 0.01,
            "restart_interval_length": 0.25,
            "lr_multiplier": 0.5,
        },
        {
            "start_value": 1.0,
            "end_value": 0.0,
            "restart_interval_length": 0.1,
            "wave_type": "full",
            "lr_multiplier": 0.9,
        },
        {
            "start_value": 1.0,
            "end_value": 0.0,
            "restart_interval_length": 0.25,
            "is_adaptive": True,
        },
        {
            "start_value": 0.8,
            "end_value": 0.2,
            "restart_interval_length": 0.4,
            "wave_type": "full",
            "is_adaptive": True,
        },
    ],
)
def test_matches_the_sgdr_formula(params: dict) -> None:
    sched = _build(**params)
    ref = {
        "start": params["start_value"],
        "end": params["end_value"],
        "length": params["restart_interval_length"],
        "wave": params.get("wave_type", "half"),
        "multiplier": params.get("lr_multiplier", 1.0),
        "adaptive": params.get("is_adaptive", False),
    }
    for where in WHERES:
        assert sched(where) == pytest.approx(_reference(where, **ref), abs=1e-9), where


def test_hand_computed_points() -> None:
    half = _build(start_value=1.0, end_value=0.0, restart_interval_length=0.5)
    assert [half(w) for w in (0.0, 0.25, 0.5, 0.75)] == pytest.approx([1.0, 0.5, 1.0, 0.5])
    assert half(0.4999) < 1e-6  # the bottom just before the restart
    full = _build(start_value=1.0, end_value=0.0, restart_interval_length=0.5, wave_type="full")
    assert [full(w) for w in (0.0, 0.125, 0.25, 0.375, 0.5)] == pytest.approx(
        [1.0, 0.5, 0.0, 0.5, 1.0]
    )
    decayed = _build(
        start_value=1.0, end_value=0.0, restart_interval_length=0.25, lr_multiplier=0.5
    )
    assert [decayed(w) for w in (0.0, 0.25, 0.5, 0.75)] == pytest.approx([1, 0.5, 0.25, 0.125])
    # Adaptive: each restart starts on the plain cosine from start to end.
    adaptive = _build(start_value=1.0, end_value=0.0, restart_interval_length=0.5, is_adaptive=True)
    assert adaptive(0.5) == pytest.approx(0.5)  # cos(pi / 2): half way down the envelope
    assert adaptive(0.75) == pytest.approx(0.25)


def test_restart_points_are_exact_despite_float_steps() -> None:
    # 0.3 / 0.1 is 2.9999999999999996 in floats: still the start of cycle 3.
    sched = _build(start_value=1.0, end_value=0.0, restart_interval_length=0.1, lr_multiplier=0.5)
    assert sched.num_cycles == 10
    assert sched(0.3) == pytest.approx(0.125)
    assert sched(0.7) == pytest.approx(0.5**7)


def test_inside_composite_uses_the_local_where() -> None:
    cwr = {
        "name": "cosine_warm_restart",
        "start_value": 0.4,
        "end_value": 0.0,
        "restart_interval_length": 0.5,
        "lr_multiplier": 0.5,
    }
    lr = {
        "name": "composite",
        "schedulers": [{"name": "linear", "start_value": 0.0, "end_value": 0.4}, cwr],
        "lengths": [0.2, 0.8],
        "interval_scaling": ["rescaled", "rescaled"],
        "update_interval": "step",
    }
    optimizer_cfg = AttrDict(
        {
            "name": "sgd",
            "num_epochs": 10,
            "head_optimizer_params": {"use_different_lr": False},
            "param_schedulers": {"lr": lr},
        }
    )
    sched = build_param_schedulers(optimizer_cfg, batch_size_per_replica=4, world_size=1)
    assert sched.update_interval("lr") == "step"
    for where in [0.0, 0.1, 0.2, 0.3, 0.5, 0.6, 0.61, 0.9, 0.99]:
        if where < 0.2:
            expected = 0.4 * where / 0.2
        else:
            expected = _reference((where - 0.2) / 0.8, 0.4, 0.0, 0.5, multiplier=0.5)
        assert sched.values(where)["lr"] == pytest.approx(expected, abs=1e-9), where
    # the restart is at local 0.5, global 0.2 + 0.8 * 0.5 = 0.6
    assert sched.values(0.6)["lr"] == pytest.approx(0.2)


def test_default_update_interval_and_auto_scaling() -> None:
    cfg = AttrDict(
        {
            "name": "cosine_warm_restart",
            "start_value": 0.2,
            "end_value": 0.02,
            "restart_interval_length": 0.5,
            "auto_lr_scaling": {"auto_scale": True, "base_value": 0.1, "base_lr_batch_size": 256},
        }
    )
    optimizer_cfg = AttrDict(
        {
            "name": "sgd",
            "num_epochs": 10,
            "head_optimizer_params": {"use_different_lr": False},
            "param_schedulers": {"lr": cfg},
        }
    )
    sched = build_param_schedulers(optimizer_cfg, batch_size_per_replica=64, world_size=8)
    assert sched.update_interval("lr") == "step"
    # VISSL rescales any "cosine*" schedule: start = 0.1 * 512 / 256, end keeps its ratio
    resolved = apply_auto_lr_scaling(cfg, batch_size_per_replica=64, world_size=8)
    assert resolved["start_value"] == pytest.approx(0.2)
    assert resolved["end_value"] == pytest.approx(0.02)
    assert sched.values(0.5)["lr"] == pytest.approx(0.2)


PATH = "config.OPTIMIZER.param_schedulers.lr"
GOOD = {"name": "cosine_warm_restart", "start_value": 1.0, "end_value": 0.0}


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"restart_interval_length": 0.0}, "restart_interval_length"),
        ({"restart_interval_length": -0.5}, "restart_interval_length"),
        ({"restart_interval_length": 1.5}, "restart_interval_length"),
        ({"restart_interval_length": "half"}, "restart_interval_length"),
        ({}, "restart_interval_length"),  # missing
        ({"restart_interval_length": 0.5, "wave_type": "quarter"}, "wave_type"),
        ({"restart_interval_length": 0.5, "lr_multiplier": 0.0}, "lr_multiplier"),
        ({"restart_interval_length": 0.5, "is_adaptive": "yes"}, "is_adaptive"),
        (
            {"restart_interval_length": 0.5, "is_adaptive": True, "lr_multiplier": 0.5},
            "lr_multiplier",
        ),
        ({"restart_interval_length": 0.5, "wave": "full"}, "wave"),  # unknown key
        ({"restart_interval_length": 0.5, "start_value": -1.0}, "start_value"),
    ],
)
def test_bad_values_name_the_key(changes: dict, key: str) -> None:
    lr = {**GOOD, **changes}
    optimizer_cfg = AttrDict(
        {
            "name": "sgd",
            "num_epochs": 2,
            "head_optimizer_params": {"use_different_lr": False},
            "param_schedulers": {"lr": lr},
        }
    )
    with pytest.raises(ConfigError) as info:
        build_param_schedulers(optimizer_cfg, batch_size_per_replica=1, world_size=1)
    assert info.value.key_path == f"{PATH}.{key}"
    assert f"{PATH}.{key}" in str(info.value)


def test_error_inside_composite_names_the_sub_scheduler() -> None:
    lr = {
        "name": "composite",
        "schedulers": [
            {"name": "linear", "start_value": 0.0, "end_value": 1.0},
            {**GOOD, "restart_interval_length": 0.5, "wave_type": "triangle"},
        ],
        "lengths": [0.5, 0.5],
    }
    with pytest.raises(ConfigError) as info:
        build_param_scheduler(lr)
    assert info.value.key_path == f"{PATH}.schedulers[1].wave_type"
    assert "'half'" in str(info.value) and "'full'" in str(info.value)

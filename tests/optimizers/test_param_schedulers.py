"""Param schedulers: values at given ``where``, VISSL auto LR scaling, lr_head, errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError, UnknownNameError
from vissl.optimizers import build_optimizer, build_param_schedulers
from vissl.optimizers.param_scheduler import build_param_scheduler
from vissl.optimizers.param_scheduler.auto_lr_scaling import apply_auto_lr_scaling


def _cosine(start: float, end: float, where: float) -> float:
    return end + 0.5 * (start - end) * (1 + math.cos(math.pi * where))


def _opt(lr: dict, **overrides: object) -> AttrDict:
    cfg = {
        "name": "sgd",
        "num_epochs": 90,
        "weight_decay": 0.0,
        "momentum": 0.9,
        "head_optimizer_params": {
            "use_different_lr": False,
            "use_different_wd": False,
            "weight_decay": 0.0,
        },
        "param_schedulers": {"lr": lr},
    }
    cfg.update(overrides)
    return AttrDict(cfg)


# The schedule of VISSL's CPU test configs.
VISSL_COMPOSITE = {
    "auto_lr_scaling": {"auto_scale": True, "base_value": 0.3, "base_lr_batch_size": 256},
    "name": "composite",
    "schedulers": [
        {"name": "linear", "start_value": 0.6, "end_value": 1.2},
        {"name": "cosine", "start_value": 1.2, "end_value": 0.0},
    ],
    "update_interval": "step",
    "interval_scaling": ["rescaled", "fixed"],
    "lengths": [0.1, 0.9],
}


def test_vissl_composite_single_node_drops_the_warmup() -> None:
    # global batch 32 * 2 = 64 -> scaled lr 0.3 * 64 / 256 = 0.075. On one node the warmup
    # would start at 0.075 too, so VISSL drops it: a cosine 0.075 -> 0 over the whole run.
    sched = build_param_schedulers(_opt(VISSL_COMPOSITE), batch_size_per_replica=32, world_size=2)
    assert sched.update_interval("lr") == "step"
    assert sched.configs["lr"]["name"] == "cosine"
    for where in (0.0, 0.05, 0.5, 0.9):
        assert sched.values(where)["lr"] == pytest.approx(_cosine(0.075, 0.0, where))
    assert sched.values(1.0)["lr"] == pytest.approx(0.0, abs=1e-9)  # clamped, no crash
    assert sched.values(0.5)["lr_head"] == sched.values(0.5)["lr"]


def test_vissl_composite_two_nodes_keeps_the_warmup() -> None:
    # 2 nodes x 1 process, 32 per replica: scaled lr 0.075, warmup starts at the per-node
    # value 0.3 * 32 / 256 = 0.0375 and rises over the first 10% (rescaled), then the
    # cosine runs on the global progress ("fixed").
    sched = build_param_schedulers(
        _opt(VISSL_COMPOSITE), batch_size_per_replica=32, world_size=2, num_nodes=2
    )
    assert sched.values(0.0)["lr"] == pytest.approx(0.0375)
    assert sched.values(0.05)["lr"] == pytest.approx(0.0375 + 0.5 * (0.075 - 0.0375))
    assert sched.values(0.5)["lr"] == pytest.approx(_cosine(0.075, 0.0, 0.5))
    assert sched.values(0.95)["lr"] == pytest.approx(_cosine(0.075, 0.0, 0.95))


def test_composite_without_auto_scaling() -> None:
    cfg = dict(VISSL_COMPOSITE, auto_lr_scaling={"auto_scale": False})
    sched = build_param_schedulers(_opt(cfg), batch_size_per_replica=32, world_size=2)
    assert sched.values(0.0)["lr"] == pytest.approx(0.6)
    assert sched.values(0.05)["lr"] == pytest.approx(0.9)
    assert sched.values(0.55)["lr"] == pytest.approx(_cosine(1.2, 0.0, 0.55))


def test_sqrt_scaling_and_the_config_is_not_mutated() -> None:
    cfg = _opt(
        dict(
            VISSL_COMPOSITE,
            auto_lr_scaling={**VISSL_COMPOSITE["auto_lr_scaling"], "scaling_type": "sqrt"},
        )
    )
    before = cfg.to_dict()
    sched = build_param_schedulers(cfg, batch_size_per_replica=64, world_size=1)
    # sqrt(64 / 256) * 0.3 = 0.15; the per-node warmup start 0.075 <= 0.15 -> dropped
    assert sched.values(0.0)["lr"] == pytest.approx(0.15)
    assert cfg.to_dict() == before


def test_large_batch_multi_node_warmup() -> None:
    sched = build_param_schedulers(
        _opt(VISSL_COMPOSITE), batch_size_per_replica=256, world_size=8, num_nodes=2
    )
    # scaled 0.3 * 2048 / 256 = 2.4, warmup from the per-node 0.3 * 1024 / 256 = 1.2
    assert sched.values(0.0)["lr"] == pytest.approx(1.2)
    assert sched.values(0.0999)["lr"] == pytest.approx(2.4, rel=1e-2)
    assert sched.values(0.1)["lr"] == pytest.approx(_cosine(2.4, 0.0, 0.1))


def test_three_part_composite_gives_the_dropped_warmup_length_to_the_next() -> None:
    lr = {
        "auto_lr_scaling": {"auto_scale": True, "base_value": 0.1, "base_lr_batch_size": 256},
        "name": "composite",
        "schedulers": [
            {"name": "linear", "start_value": 0.0, "end_value": 0.1},
            {"name": "constant", "value": 0.1},
            {"name": "cosine", "start_value": 0.1, "end_value": 0.001},
        ],
        "lengths": [0.1, 0.4, 0.5],
        "interval_scaling": ["rescaled", "rescaled", "rescaled"],
    }
    resolved = apply_auto_lr_scaling(lr, batch_size_per_replica=64, world_size=1)
    assert [s["name"] for s in resolved["schedulers"]] == ["constant", "cosine"]
    assert resolved["lengths"] == pytest.approx([0.5, 0.5])
    sched = build_param_schedulers(_opt(lr), batch_size_per_replica=64, world_size=1)
    assert sched.values(0.2)["lr"] == pytest.approx(0.025)
    assert sched.values(0.75)["lr"] == pytest.approx(_cosine(0.025, 0.00025, 0.5))


@pytest.mark.parametrize(
    "lr,where,expected",
    [
        ({"name": "constant", "value": 0.1}, 0.5, 0.2),
        ({"name": "cosine", "start_value": 0.1, "end_value": 0.001}, 0.0, 0.2),
        ({"name": "cosine", "start_value": 0.1, "end_value": 0.001}, 0.9999, 0.002),
        ({"name": "linear", "start_value": 0.0, "end_value": 0.1}, 0.5, 0.1),  # end -> 0.2
        ({"name": "multistep", "values": [0.1, 0.01, 0.001], "milestones": [30, 60]}, 0.5, 0.02),
        (
            {"name": "step_with_fixed_gamma", "base_value": 0.1, "gamma": 0.1, "num_decays": 2},
            0.0,
            0.2,
        ),
    ],
)
def test_auto_scaling_per_scheduler(lr: dict, where: float, expected: float) -> None:
    lr = dict(
        lr, auto_lr_scaling={"auto_scale": True, "base_value": 0.1, "base_lr_batch_size": 256}
    )
    sched = build_param_schedulers(_opt(lr), batch_size_per_replica=256, world_size=2)
    assert sched.values(where)["lr"] == pytest.approx(expected, rel=1e-3)


def test_multistep_like_classy_vision() -> None:
    lr = {
        "name": "multistep",
        "values": [0.1, 0.01, 0.001],
        "milestones": [30, 60],
        "update_interval": "epoch",
    }
    sched = build_param_schedulers(_opt(lr), batch_size_per_replica=32, world_size=1)
    assert sched.update_interval("lr") == "epoch"
    for epoch, value in [(0, 0.1), (29, 0.1), (30, 0.01), (59, 0.01), (60, 0.001), (89, 0.001)]:
        assert sched.values(epoch / 90)["lr"] == pytest.approx(value)
    assert sched.values(1.0)["lr"] == pytest.approx(0.001)
    # no milestones: equal steps over num_epochs
    even = build_param_schedulers(
        _opt({"name": "multistep", "values": [1.0, 0.5, 0.25]}),
        batch_size_per_replica=1,
        world_size=1,
    )
    assert [even.values(w)["lr"] for w in (0.0, 0.34, 0.67)] == [1.0, 0.5, 0.25]


def test_step_polynomial_and_default_intervals() -> None:
    step = build_param_schedulers(
        _opt({"name": "step", "values": [1.0, 0.1]}), batch_size_per_replica=1, world_size=1
    )
    assert step.update_interval("lr") == "epoch"
    assert step.values(0.49)["lr"] == 1.0 and step.values(0.5)["lr"] == 0.1
    assert step.values(1.0)["lr"] == 0.1  # clamped below 1: no IndexError
    poly = build_param_schedulers(
        _opt({"name": "polynomial", "base_value": 1.0, "power": 2.0}),
        batch_size_per_replica=1,
        world_size=1,
    )
    assert poly.update_interval("lr") == "step"
    assert poly.values(0.5)["lr"] == pytest.approx(0.25)


class _HeadModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = torch.nn.Linear(2, 2)
        self.heads = torch.nn.ModuleList([torch.nn.Linear(2, 2)])


def test_lr_head_schedule_and_apply_by_interval() -> None:
    cfg = _opt(
        {
            "name": "multistep",
            "values": [0.1, 0.01],
            "milestones": [45],
            "update_interval": "epoch",
        },
        head_optimizer_params={
            "use_different_lr": True,
            "use_different_wd": False,
            "weight_decay": 0.0,
        },
    )
    cfg.param_schedulers["lr_head"] = {
        "auto_lr_scaling": {"auto_scale": True, "base_value": 1.0, "base_lr_batch_size": 256},
        "name": "cosine",
        "start_value": 1.0,
        "end_value": 0.0,
        "update_interval": "step",
    }
    sched = build_param_schedulers(cfg, batch_size_per_replica=64, world_size=2)  # head: 0.5
    assert sched.update_interval("lr") == "epoch" and sched.update_interval("lr_head") == "step"
    optimizer = build_optimizer(cfg, _HeadModel(), param_schedulers=sched)
    lrs = {g["param_group_name"]: g["lr"] for g in optimizer.param_groups}
    assert lrs == {"trunk_regularized": 0.1, "head_regularized": pytest.approx(0.5)}

    sched.apply(optimizer, 0.5, "step")  # only the head follows step updates
    lrs = {g["param_group_name"]: g["lr"] for g in optimizer.param_groups}
    assert lrs["trunk_regularized"] == 0.1
    assert lrs["head_regularized"] == pytest.approx(_cosine(0.5, 0.0, 0.5))
    sched.apply(optimizer, 0.5, "epoch")
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    sched.apply(optimizer, 1.0, None)  # clamped end of training, every group
    assert optimizer.param_groups[1]["lr"] == pytest.approx(0.0, abs=1e-9)


def test_head_follows_lr_without_use_different_lr() -> None:
    cfg = _opt({"name": "constant", "value": 0.3})
    cfg.param_schedulers["lr_head"] = {"name": "constant", "value": 9.0}  # ignored, as in VISSL
    sched = build_param_schedulers(cfg, batch_size_per_replica=1, world_size=1)
    assert sched.values(0.2) == {"lr": 0.3, "lr_head": 0.3}
    optimizer = build_optimizer(cfg, _HeadModel())
    sched.apply(optimizer, 0.2, "epoch")
    assert [g["lr"] for g in optimizer.param_groups] == [0.3, 0.3]


def test_defaults_yaml_optimizer_section_builds() -> None:
    path = Path(vissl.__file__).parent / "config" / "defaults.yaml"
    config = AttrDict(yaml.safe_load(path.read_text())["config"])
    sched = build_param_schedulers(config.OPTIMIZER, batch_size_per_replica=32, world_size=1)
    assert sched.values(0.0)["lr"] == pytest.approx(0.1)
    assert sched.values(61 / 90)["lr"] == pytest.approx(0.001)
    optimizer = build_optimizer(config.OPTIMIZER, _HeadModel(), param_schedulers=sched)
    assert isinstance(optimizer, torch.optim.SGD)


@pytest.mark.parametrize(
    "lr,key",
    [
        ({"name": "cosine", "start_value": 0.1}, "config.OPTIMIZER.param_schedulers.lr.end_value"),
        (
            {"name": "multistep", "values": [0.1, 0.01], "milestones": [30, 60]},
            "config.OPTIMIZER.param_schedulers.lr.milestones",
        ),
        (
            {"name": "multistep", "values": [0.1, 0.01], "milestones": [95]},
            "config.OPTIMIZER.param_schedulers.lr.milestones",
        ),
        (
            {
                "name": "composite",
                "schedulers": [{"name": "constant", "value": 1.0}],
                "lengths": [0.5],
            },
            "config.OPTIMIZER.param_schedulers.lr.lengths",
        ),
        (
            {
                "name": "composite",
                "schedulers": [{"name": "constant"}, {"name": "constant", "value": 1}],
                "lengths": [0.5, 0.5],
            },
            "config.OPTIMIZER.param_schedulers.lr.schedulers[0].value",
        ),
        (
            {"name": "constant", "value": 0.1, "update_interval": "iteration"},
            "config.OPTIMIZER.param_schedulers.lr.update_interval",
        ),
        (
            {
                "name": "polynomial",
                "base_value": 0.1,
                "power": 1.0,
                "auto_lr_scaling": {
                    "auto_scale": True,
                    "base_value": 0.1,
                    "base_lr_batch_size": 256,
                },
            },
            "config.OPTIMIZER.param_schedulers.lr.name",
        ),
        (
            {
                "name": "constant",
                "value": 0.1,
                "auto_lr_scaling": {
                    "auto_scale": True,
                    "base_value": 0.1,
                    "base_lr_batch_size": 256,
                    "scaling_type": "log",
                },
            },
            "config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.scaling_type",
        ),
        (
            {"name": "linear", "start_value": 0.0, "end_value": -1.0},
            "config.OPTIMIZER.param_schedulers.lr.end_value",
        ),
    ],
)
def test_scheduler_errors_name_the_key(lr: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_param_schedulers(_opt(lr), batch_size_per_replica=32, world_size=1)
    assert info.value.key_path == key
    assert key in str(info.value)


def test_missing_lr_head_and_unknown_names() -> None:
    cfg = _opt({"name": "constant", "value": 0.1}, head_optimizer_params={"use_different_lr": True})
    with pytest.raises(ConfigError) as info:
        build_param_schedulers(cfg, batch_size_per_replica=1, world_size=1)
    assert info.value.key_path == "config.OPTIMIZER.param_schedulers.lr_head"
    composite = {
        "name": "composite",
        "schedulers": [
            {"name": "constant", "value": 1.0},
            {"name": "cosine_decay", "start_value": 1, "end_value": 0},
        ],
        "lengths": [0.5, 0.5],
    }
    with pytest.raises(UnknownNameError) as unknown:
        build_param_schedulers(_opt(composite), batch_size_per_replica=1, world_size=1)
    assert "config.OPTIMIZER.param_schedulers.lr.schedulers[1].name" in str(unknown.value)
    assert "'cosine'" in str(unknown.value)
    with pytest.raises(ConfigError, match=r"param_schedulers\.lr"):
        build_param_schedulers(
            AttrDict(param_schedulers={}), batch_size_per_replica=1, world_size=1
        )


def test_build_param_scheduler_directly() -> None:
    s = build_param_scheduler({"name": "linear", "start_value": 0.0, "end_value": 1.0})
    assert s(0.25) == pytest.approx(0.25)

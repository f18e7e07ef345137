"""The schedules the trainer applies every step: exactly fvcore's values at ``where``.

``ParamSchedulerSet.apply`` runs on every optimizer step, so it is kept lean (each due
schedule evaluated once, nothing done for an interval with no schedule due). These tests
pin its results to a plain reference: every group that follows a schedule due at the
interval gets that schedule's value at ``clamp_where(where)``, bit for bit.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from tests._tiny_run import tiny_config
from tests._tiny_run import train_in_process as train
from vissl.config.attr_dict import AttrDict
from vissl.hooks import Priority, VisslHook
from vissl.optimizers import build_optimizer, build_param_schedulers
from vissl.optimizers.param_scheduler import ParamSchedulerSet
from vissl.optimizers.param_scheduler.scheduler_set import clamp_where
from vissl.trainer.task import SelfSupervisionTask

COSINE = {"name": "cosine", "start_value": 0.1, "end_value": 0.001}
LINEAR_HEAD = {"name": "linear", "start_value": 0.5, "end_value": 0.05}
WD_COSINE = {"name": "cosine", "start_value": 0.04, "end_value": 0.4}
WD_HEAD = {"name": "linear", "start_value": 0.1, "end_value": 0.0}
CONSTANT = {"name": "constant", "value": 0.2}  # updated per epoch by default
WHERES = [0.0, 1e-9, 0.013, 0.1, 0.25, 1 / 3, 0.5, 0.77, 0.999, 0.99999999, 1.0]


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU())
        self.heads = nn.ModuleList([nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads[0](self.trunk(x))


def _opt_cfg(schedules: dict[str, Any], **head: Any) -> AttrDict:
    return AttrDict(
        {
            "name": "sgd",
            "use_larc": False,
            "weight_decay": 1e-4,
            "momentum": 0.9,
            "nesterov": False,
            "num_epochs": 10,
            "regularize_bn": False,
            "regularize_bias": True,
            "non_regularized_parameters": [],
            "head_optimizer_params": {
                "use_different_lr": False,
                "use_different_wd": False,
                "weight_decay": 0.5,
                **head,
            },
            "param_schedulers": copy.deepcopy(schedules),
            "construct_single_param_group_only": False,
        }
    )


def reference_apply(
    schedules: ParamSchedulerSet, groups: list[dict[str, Any]], where: float, interval: str | None
) -> None:
    """What ``apply`` must do, written plainly (one scheduler call per group and value)."""
    w = clamp_where(where)
    for group in groups:
        name = schedules.group_schedule_name(group)
        if interval is None or schedules.update_interval(name) == interval:
            group["lr"] = float(schedules.scheduler(name)(w))
        wd_name = schedules.weight_decay_schedule_name(group)
        if wd_name is not None and (
            interval is None or schedules.update_interval(wd_name) == interval
        ):
            group["weight_decay"] = float(schedules.scheduler(wd_name)(w))


CASES = {
    "cosine lr, linear head lr, cosine weight decay": (
        {"lr": COSINE, "lr_head": LINEAR_HEAD, "weight_decay": WD_COSINE},
        {"use_different_lr": True},
    ),
    "head with its own weight decay": (
        {"lr": COSINE, "weight_decay": WD_COSINE},
        {"use_different_wd": True},
    ),
    "constant lr per epoch, weight decay per step": (
        {"lr": CONSTANT, "weight_decay": WD_COSINE},
        {},
    ),
    "weight decay per epoch": (
        {"lr": COSINE, "weight_decay": {**WD_COSINE, "update_interval": "epoch"}},
        {},
    ),
    "lr only": ({"lr": COSINE}, {}),
    "head weight decay per epoch, trunk weight decay per step": (
        {
            "lr": COSINE,
            "weight_decay": WD_COSINE,
            "weight_decay_head": {**WD_HEAD, "update_interval": "epoch"},
        },
        {},
    ),
    "head weight decay only, replacing the head's own": (
        {"lr": COSINE, "weight_decay_head": WD_HEAD},
        {"use_different_wd": True},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_apply_matches_the_plain_reference_bit_for_bit(case: str) -> None:
    schedules_cfg, head = CASES[case]
    cfg = _opt_cfg(schedules_cfg, **head)
    schedules = build_param_schedulers(cfg, batch_size_per_replica=8, world_size=1)
    optimizer = build_optimizer(cfg, TinyModel(), param_schedulers=schedules)
    assert len(optimizer.param_groups) > 1
    expected = [dict(g, params=None) for g in optimizer.param_groups]
    for where in WHERES:
        for interval in ("step", "epoch", None):
            # the groups start from different values: a group left alone keeps its own
            for g, e in zip(optimizer.param_groups, expected, strict=True):
                g["lr"] = e["lr"] = -1.0 - where
                g["weight_decay"] = e["weight_decay"] = -2.0 - where
            schedules.apply(optimizer, where, interval)
            reference_apply(schedules, expected, where, interval)
            got = [(g["lr"], g["weight_decay"]) for g in optimizer.param_groups]
            assert got == [(e["lr"], e["weight_decay"]) for e in expected], (where, interval)


def test_apply_rejects_an_unknown_interval() -> None:
    cfg = _opt_cfg({"lr": COSINE})
    schedules = build_param_schedulers(cfg, batch_size_per_replica=8, world_size=1)
    optimizer = build_optimizer(cfg, TinyModel(), param_schedulers=schedules)
    with pytest.raises(ValueError, match="interval must be 'step', 'epoch' or None"):
        schedules.apply(optimizer, 0.5, "iteration")


class AppliedValues(VisslHook):
    """Every group's lr and weight decay right after each optimizer step, with ``where``."""

    priority = Priority.HIGHEST

    def __init__(self) -> None:
        self.rows: list[tuple[float, list[tuple[str, bool, float, float]]]] = []

    def on_update(self, task: SelfSupervisionTask) -> None:
        groups = [
            (
                g.get("param_group_name", ""),
                bool(g.get("is_head", False)),
                g["lr"],
                g["weight_decay"],
            )
            for g in task.optimizer.param_groups
        ]
        self.rows.append((task.where, groups))


@pytest.mark.parametrize("head_wd", [False, True])
def test_every_training_step_uses_the_schedule_value_at_where(tmp_path: Any, head_wd: bool) -> None:
    head = (
        [
            "+config.OPTIMIZER.param_schedulers.weight_decay_head={name: linear, start_value: 0.1, "
            "end_value: 0.0}"
        ]
        if head_wd
        else []
    )
    cfg = tiny_config(
        tmp_path,
        *head,
        "config.OPTIMIZER.param_schedulers.lr.name=cosine",
        "config.OPTIMIZER.param_schedulers.lr.update_interval=step",
        "config.OPTIMIZER.param_schedulers.lr.start_value=0.1",
        "config.OPTIMIZER.param_schedulers.lr.end_value=0.001",
        "config.OPTIMIZER.head_optimizer_params.use_different_lr=True",
        "+config.OPTIMIZER.param_schedulers.lr_head={name: linear, start_value: 0.2, "
        "end_value: 0.02}",
        "+config.OPTIMIZER.param_schedulers.weight_decay={name: cosine, start_value: 0.04, "
        "end_value: 0.4}",
        "config.TEST_MODEL=False",
    )
    recorder = AppliedValues()
    task = train(cfg, [recorder])
    fresh = build_param_schedulers(cfg.OPTIMIZER, batch_size_per_replica=8, world_size=1)
    assert len(recorder.rows) == task.max_iteration == 8
    wheres = [where for where, _ in recorder.rows]
    assert wheres == [i / 8 for i in range(8)]
    heads = set()
    for where, groups in recorder.rows:
        values = fresh.values(where)
        for name, is_head, lr, wd in groups:
            heads.add(is_head)
            assert lr == values["lr_head" if is_head else "lr"], (where, name)
            if name == "head_regularized" and head_wd:
                assert wd == values["weight_decay_head"] == pytest.approx(0.1 * (1 - where))
            elif name in ("trunk_regularized", "head_regularized"):
                assert wd == values["weight_decay"], (where, name)
            else:
                assert wd == 0.0, (where, name)
    assert heads == {True, False}

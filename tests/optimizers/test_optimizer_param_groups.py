"""build_optimizer: param groups (bn / bias / head / non-regularized), builders, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError, UnknownNameError
from vissl.optimizers import LARC, build_optimizer, build_param_schedulers


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        self.cls_token = nn.Parameter(torch.zeros(4))
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.heads = nn.ModuleList(
            [nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))]
        )


def _opt_cfg(**overrides: object) -> AttrDict:
    cfg = {
        "name": "sgd",
        "use_larc": False,
        "larc_config": {"clip": False, "eps": 1e-8, "trust_coefficient": 0.001},
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
            "weight_decay": 1e-4,
        },
        "param_schedulers": {"lr": {"name": "constant", "value": 0.1, "update_interval": "epoch"}},
        "construct_single_param_group_only": False,
    }
    cfg.update(overrides)
    return AttrDict(cfg)


def _by_name(optimizer: torch.optim.Optimizer) -> dict[str, dict]:
    return {g["param_group_name"]: g for g in optimizer.param_groups}


def _ids(params: list) -> set[int]:
    return {id(p) for p in params}


def test_bn_params_unregularized_and_heads_separated() -> None:
    model = TinyModel()
    groups = _by_name(build_optimizer(_opt_cfg(), model))
    assert set(groups) == {
        "trunk_regularized",
        "trunk_unregularized",
        "head_regularized",
        "head_unregularized",
    }
    bn = model.trunk[1]
    conv = model.trunk[0]
    head = model.heads[0]
    assert _ids(groups["trunk_unregularized"]["params"]) == _ids([bn.weight, bn.bias])
    assert _ids(groups["trunk_regularized"]["params"]) == _ids(
        [conv.weight, conv.bias, model.cls_token]
    )
    assert _ids(groups["head_unregularized"]["params"]) == _ids([head[1].weight, head[1].bias])
    assert _ids(groups["head_regularized"]["params"]) == _ids(
        [head[0].weight, head[0].bias, head[2].weight, head[2].bias]
    )
    assert groups["trunk_unregularized"]["weight_decay"] == 0.0
    assert groups["trunk_regularized"]["weight_decay"] == 1e-4
    assert [g["is_head"] for g in groups.values()] == [False, False, True, True]
    all_ids = set().union(*(_ids(g["params"]) for g in groups.values()))
    assert id(model.frozen.weight) not in all_ids  # requires_grad False is skipped
    assert all(g["lr"] == 0.1 for g in groups.values())


def test_regularize_bias_false_and_non_regularized_names() -> None:
    model = TinyModel()
    cfg = _opt_cfg(
        regularize_bias=False, regularize_bn=True, non_regularized_parameters=["cls_token"]
    )
    groups = _by_name(build_optimizer(cfg, model))
    bn, conv, head = model.trunk[1], model.trunk[0], model.heads[0]
    assert _ids(groups["trunk_regularized"]["params"]) == _ids([conv.weight, bn.weight])
    assert _ids(groups["trunk_unregularized"]["params"]) == _ids(
        [conv.bias, bn.bias, model.cls_token]
    )
    assert _ids(groups["head_unregularized"]["params"]) == _ids(
        [head[0].bias, head[1].bias, head[2].bias]
    )


def test_head_weight_decay_and_lr_head() -> None:
    model = TinyModel()
    cfg = _opt_cfg(
        head_optimizer_params={
            "use_different_lr": True,
            "use_different_wd": True,
            "weight_decay": 0.05,
        },
        param_schedulers={
            "lr": {"name": "constant", "value": 0.1},
            "lr_head": {"name": "constant", "value": 1.0},
        },
    )
    schedulers = build_param_schedulers(cfg, batch_size_per_replica=32, world_size=1)
    optimizer = build_optimizer(cfg, model, param_schedulers=schedulers)
    groups = _by_name(optimizer)
    assert groups["head_regularized"]["weight_decay"] == 0.05
    assert groups["head_unregularized"]["weight_decay"] == 0.0
    assert groups["head_regularized"]["lr"] == 1.0 and groups["trunk_regularized"]["lr"] == 0.1
    # use_different_wd false: head uses the trunk's weight decay.
    groups = _by_name(
        build_optimizer(_opt_cfg(head_optimizer_params={"weight_decay": 0.05}), model)
    )
    assert groups["head_regularized"]["weight_decay"] == 1e-4


class TwoHeadModel(nn.Module):
    """A trunk, a projector (head 0) and a predictor (head 1), as SimSiam's."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(4, 4)
        self.heads = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])


def test_head_indices_put_only_those_heads_in_the_head_groups() -> None:
    """SimSiam's --fix-pred-lr: the predictor (head 1) alone follows lr_head (held), the
    projector stays with the trunk's cosine; the head weight decay is the predictor's."""
    model = TwoHeadModel()
    cfg = _opt_cfg(
        head_optimizer_params={
            "use_different_lr": True,
            "use_different_wd": True,
            "weight_decay": 0.0,
            "head_indices": [1],
        },
        param_schedulers={
            "lr": {"name": "cosine", "start_value": 0.1, "end_value": 0.0},
            "lr_head": {"name": "constant", "value": 0.1},
        },
    )
    schedules = build_param_schedulers(cfg, batch_size_per_replica=32, world_size=1)
    optimizer = build_optimizer(cfg, model, param_schedulers=schedules)
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    predictor = {id(p) for p in model.heads[1].parameters()}
    for name, param in model.named_parameters():
        assert group_of[id(param)]["is_head"] == (id(param) in predictor), name
    schedules.apply(optimizer, 0.5, None)
    assert group_of[id(model.heads[1].weight)]["lr"] == pytest.approx(0.1)
    assert group_of[id(model.heads[0].weight)]["lr"] == pytest.approx(0.05)
    assert group_of[id(model.trunk.weight)]["lr"] == pytest.approx(0.05)
    assert group_of[id(model.heads[1].weight)]["weight_decay"] == 0.0
    assert group_of[id(model.heads[0].weight)]["weight_decay"] == 1e-4


@pytest.mark.parametrize("indices", [[2], [0, 0], [-1], "1", [True]])
def test_bad_head_indices_name_the_key(indices: object) -> None:
    cfg = _opt_cfg(head_optimizer_params={"head_indices": indices})
    with pytest.raises(ConfigError, match=r"head_optimizer_params\.head_indices") as err:
        build_optimizer(cfg, TwoHeadModel())
    assert "2 head(s)" in str(err.value)


def test_head_indices_with_another_constructor_is_an_error() -> None:
    cfg = _opt_cfg(head_optimizer_params={"head_indices": [1]}, param_group_constructor="dino")
    with pytest.raises(ConfigError, match="'default' param-group constructor"):
        build_optimizer(cfg, TwoHeadModel())


def test_single_param_group() -> None:
    model = TinyModel()
    optimizer = build_optimizer(_opt_cfg(construct_single_param_group_only=True), model)
    assert len(optimizer.param_groups) == 1
    group = optimizer.param_groups[0]
    assert group["param_group_name"] == "all" and group["is_head"] is False
    assert len(group["params"]) == sum(1 for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    "name,cls", [("sgd", torch.optim.SGD), ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)]
)
def test_builders(name: str, cls: type) -> None:
    model = TinyModel()
    optimizer = build_optimizer(_opt_cfg(name=name, betas=[0.8, 0.99]), model)
    assert type(optimizer) is cls
    if name == "sgd":
        assert optimizer.param_groups[0]["momentum"] == 0.9
    else:
        assert optimizer.param_groups[0]["betas"] == (0.8, 0.99)
    loss = sum(p.sum() for p in model.parameters() if p.requires_grad)
    loss.backward()
    optimizer.step()


def test_larc_wrapper_is_an_optimizer_with_shared_groups() -> None:
    model = TinyModel()
    optimizer = build_optimizer(_opt_cfg(use_larc=True), model)
    assert isinstance(optimizer, LARC) and isinstance(optimizer, torch.optim.Optimizer)
    assert optimizer.param_groups is optimizer.optim.param_groups
    assert optimizer.param_groups[0]["param_group_name"] == "trunk_regularized"


@pytest.mark.parametrize(
    "overrides,key",
    [
        ({"momentum": -0.1}, "config.OPTIMIZER.momentum"),
        ({"momentum": 1.0}, "config.OPTIMIZER.momentum"),
        ({"weight_decay": -1.0}, "config.OPTIMIZER.weight_decay"),
        ({"nesterov": True, "momentum": 0.0}, "config.OPTIMIZER.nesterov"),
        ({"nesterov": "yes"}, "config.OPTIMIZER.nesterov"),
        ({"name": "adam", "betas": [0.9]}, "config.OPTIMIZER.betas"),
        (
            {"use_larc": True, "larc_config": {"trust_coefficient": -1}},
            "config.OPTIMIZER.larc_config.trust_coefficient",
        ),
        (
            {"param_schedulers": {"lr": {"name": "constant", "value": -0.1}}},
            "config.OPTIMIZER.param_schedulers.lr.value",
        ),
        (
            {"head_optimizer_params": {"use_different_wd": True, "weight_decay": -1}},
            "config.OPTIMIZER.head_optimizer_params.weight_decay",
        ),
    ],
)
def test_bad_values_name_the_key(overrides: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_optimizer(_opt_cfg(**overrides), TinyModel())
    assert info.value.key_path == key
    assert key in str(info.value)


def test_unknown_optimizer() -> None:
    with pytest.raises(UnknownNameError) as info:
        build_optimizer(_opt_cfg(name="sgdd"), TinyModel())
    assert "config.OPTIMIZER.name" in str(info.value) and "'sgd'" in str(info.value)

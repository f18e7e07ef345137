"""``OPTIMIZER.param_group_constructor``: ``lr_decay``, ``dino``, ``linear_eval_heads``.

The layer-wise decay is checked against the hand formula: with ``L`` blocks, a
parameter of block ``i`` learns at ``lr * decay ** (L - i)``, the embeddings at
``lr * decay ** (L + 1)``, the trunk's last norm at ``lr * decay`` and the heads at
``lr``, at every point of the schedule (the groups' lr is set by the schedules).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

from vissl.config.validation import UnsupportedConfigWarning
from vissl.errors import ConfigError, UnknownNameError
from vissl.models import build_model
from vissl.optimizers import build_optimizer, build_param_schedulers
from vissl.optimizers.param_groups import PARAM_GROUP_CONSTRUCTOR_REGISTRY
from vissl.optimizers.param_groups.layer_decay import resnet_param_depth, vit_param_depth
from vissl.utils.hydra_config import hydra_compose_and_validate

QUICK = "config=test/integration_test/quick_cutmixup_supervised"


def _cfg(*overrides: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsupportedConfigWarning)
        _, cfg = hydra_compose_and_validate([QUICK, *overrides])
    return cfg


def _build(cfg: Any, model: nn.Module | None = None) -> tuple[nn.Module, Any, Any]:
    model = model if model is not None else build_model(cfg.MODEL, cfg.OPTIMIZER)
    schedules = build_param_schedulers(cfg.OPTIMIZER, batch_size_per_replica=8, world_size=1)
    optimizer = build_optimizer(
        cfg.OPTIMIZER, model, param_schedulers=schedules, model_config=cfg.MODEL
    )
    return model, schedules, optimizer


def _group_of(optimizer: torch.optim.Optimizer) -> dict[int, dict[str, Any]]:
    return {id(p): g for g in optimizer.param_groups for p in g["params"]}


def _vit_scale(name: str, layers: int, decay: float) -> float:
    """The hand formula, written out by name."""
    if name.startswith("heads."):
        return 1.0
    if name in ("trunk.cls_token", "trunk.pos_embed") or name.startswith("trunk.patch_embed."):
        return decay ** (layers + 1)
    if name.startswith("trunk.norm."):
        return decay
    block = int(name.split(".")[2])  # trunk.blocks.<i>.
    return decay ** (layers - block)


@pytest.mark.parametrize("layers", [2, 3])
def test_vit_layer_decay_matches_the_hand_formula(layers: int) -> None:
    decay = 0.65
    cfg = _cfg(
        f"config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS={layers}",
        f"config.OPTIMIZER.layer_wise_lr_decay.decay={decay}",
        "config.OPTIMIZER.weight_decay=0.05",
    )
    model, schedules, optimizer = _build(cfg)
    groups = _group_of(optimizer)
    names = dict(model.named_parameters())
    assert len(groups) == len(names)  # every parameter, once
    assert optimizer.param_groups[0]["lr_scale"] == 1.0  # the heads first (the logged lr)
    for where in (0.0, 0.1, 0.6):
        schedules.apply(optimizer, where, None)
        base = schedules.values(where)["lr"]
        for name, param in names.items():
            group = groups[id(param)]
            want = base * _vit_scale(name, layers, decay)
            assert group["lr"] == pytest.approx(want, rel=1e-12), name
            no_decay = name.endswith(".bias") or "norm" in name
            assert group["weight_decay"] == (0.0 if no_decay else 0.05), name
    depths = {vit_param_depth(n, layers) for n in names}
    assert depths == set(range(layers + 2))


def _dinov2_scale(name: str, layers: int, decay: float, patch_embed_lr_mult: float) -> float:
    """DINOv2's get_vit_lr_decay_rate and get_params_groups_with_decay, written out for our
    names: layer_id L + 1 unless an embedding (0) or block i (i + 1); patch_embed's rate
    times patch_embed_lr_mult."""
    layer_id = layers + 1
    trunk_name = name.removeprefix("trunk.")
    if not name.startswith("heads.") and any(
        e in trunk_name for e in ("pos_embed", "patch_embed", "masked_embed", "cls_token")
    ):
        layer_id = 0
    elif trunk_name.startswith("blocks."):
        layer_id = int(trunk_name.split(".")[1]) + 1
    scale = decay ** (layers + 1 - layer_id)
    return scale * patch_embed_lr_mult if "patch_embed" in name else scale


@pytest.mark.parametrize("mult", [0.2, 0.5])
def test_patch_embed_lr_mult_and_the_final_norm_at_the_heads_rate(mult: float) -> None:
    """DINOv2's groups: the patch embedding at mult times its depth's rate (its bias too),
    the final norm at the schedule's rate, as the heads."""
    layers, decay = 3, 0.8
    cfg = _cfg(
        f"config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS={layers}",
        f"config.OPTIMIZER.layer_wise_lr_decay.decay={decay}",
        f"config.OPTIMIZER.layer_wise_lr_decay.patch_embed_lr_mult={mult}",
        "config.OPTIMIZER.layer_wise_lr_decay.final_norm_with_heads=True",
        "config.OPTIMIZER.weight_decay=0.05",
    )
    model, schedules, optimizer = _build(cfg)
    groups = _group_of(optimizer)
    names = dict(model.named_parameters())
    assert len(groups) == len(names)
    schedules.apply(optimizer, 0.3, None)
    base = schedules.values(0.3)["lr"]
    for name, param in names.items():
        want = base * _dinov2_scale(name, layers, decay, mult)
        assert groups[id(param)]["lr"] == pytest.approx(want, rel=1e-12), name
    assert groups[id(names["trunk.norm.weight"])]["lr_scale"] == 1.0
    assert groups[id(names["trunk.patch_embed.proj.weight"])]["lr_scale"] == pytest.approx(
        decay ** (layers + 1) * mult
    )
    assert groups[id(names["trunk.pos_embed"])]["lr_scale"] == pytest.approx(decay ** (layers + 1))
    patch_groups = {
        g["param_group_name"]
        for g in optimizer.param_groups
        if "patch_embed" in g["param_group_name"]
    }
    assert patch_groups == {"layer0_patch_embed_regularized", "layer0_patch_embed_unregularized"}


def test_the_final_norm_is_one_layer_below_the_heads_by_default() -> None:
    """VISSL's depth L for the final norm stays the default (BEiT, MAE and DINOv2 put it
    with the heads: final_norm_with_heads)."""
    cfg = _cfg("config.OPTIMIZER.layer_wise_lr_decay.decay=0.5")
    model, _, optimizer = _build(cfg)
    names = dict(model.named_parameters())
    groups = _group_of(optimizer)
    assert groups[id(names["trunk.norm.bias"])]["lr_scale"] == 0.5
    assert (
        groups[id(names["trunk.patch_embed.proj.weight"])]["lr_scale"]
        == groups[id(names["trunk.pos_embed"])]["lr_scale"]
    )
    assert vit_param_depth("trunk.norm.weight", 4) == 4
    assert vit_param_depth("trunk.norm.weight", 4, final_norm_with_heads=True) == 5


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("patch_embed_lr_mult=-0.1", "patch_embed_lr_mult"),
        ("patch_embed_lr_mult=fast", "patch_embed_lr_mult"),
        ("final_norm_with_heads=1", "final_norm_with_heads"),
    ],
)
def test_lr_decay_options_errors(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        _build(_cfg(f"config.OPTIMIZER.layer_wise_lr_decay.{override}"))
    assert err.value.key_path == f"config.OPTIMIZER.layer_wise_lr_decay.{key}"


@pytest.mark.parametrize("override", ["patch_embed_lr_mult=0.2", "final_norm_with_heads=True"])
def test_vit_only_lr_decay_options_on_a_resnet_are_an_error(override: str) -> None:
    cfg = _cfg(
        "config.MODEL.TRUNK.NAME=resnet",
        "config.MODEL.TRUNK.RESNETS.DEPTH=18",
        "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
        "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,10]}]]",
        f"config.OPTIMIZER.layer_wise_lr_decay.{override}",
    )
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match="vision_transformer") as err:
        _build(cfg)
    assert err.value.key_path == f"config.OPTIMIZER.layer_wise_lr_decay.{key}"


def test_weight_decay_schedule_sets_the_regularized_decay_groups_only() -> None:
    cfg = _cfg(
        "+config.OPTIMIZER.param_schedulers.weight_decay={name: linear, start_value: 0.04, "
        "end_value: 0.4, update_interval: step}"
    )
    _, schedules, optimizer = _build(cfg)
    schedules.apply(optimizer, 0.5, None)
    for group in optimizer.param_groups:
        reg = group["param_group_name"].endswith("_regularized")
        assert group["weight_decay"] == (pytest.approx(0.22) if reg else 0.0)


def test_resnet_depths_and_regularization() -> None:
    decay = 0.5
    cfg = _cfg(
        "config.MODEL.TRUNK.NAME=resnet",
        "config.MODEL.TRUNK.RESNETS.DEPTH=18",
        "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
        "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[128,10]}]]",
        f"config.OPTIMIZER.layer_wise_lr_decay.decay={decay}",
        "config.OPTIMIZER.regularize_bn=False",
        "config.OPTIMIZER.regularize_bias=True",
    )
    model, schedules, optimizer = _build(cfg)
    schedules.apply(optimizer, 0.3, None)
    base = schedules.values(0.3)["lr"]
    groups = _group_of(optimizer)
    params = dict(model.named_parameters())
    want_depth = {
        "trunk._feature_blocks.conv1.weight": 0,
        "trunk._feature_blocks.bn1.bias": 0,
        "trunk._feature_blocks.layer1.0.conv1.weight": 1,
        "trunk._feature_blocks.layer2.0.downsample.1.weight": 2,
        "trunk._feature_blocks.layer4.1.conv2.weight": 4,
        "heads.0.clf.0.weight": 5,
    }
    for name, depth in want_depth.items():
        assert resnet_param_depth(name) == depth
        assert groups[id(params[name])]["lr"] == pytest.approx(base * decay ** (5 - depth))
    # the downsample BatchNorm is a norm layer: regularize_bn False leaves it undecayed
    assert groups[id(params["trunk._feature_blocks.layer2.0.downsample.1.weight"])][
        "weight_decay"
    ] == (0.0)
    assert groups[id(params["heads.0.clf.0.bias"])]["weight_decay"] > 0  # regularize_bias


def test_lr_decay_errors() -> None:
    with pytest.raises(ConfigError) as err:
        _build(_cfg("config.OPTIMIZER.layer_wise_lr_decay.decay=1.5"))
    assert err.value.key_path == "config.OPTIMIZER.layer_wise_lr_decay.decay"
    cfg = _cfg()
    cfg.MODEL.TRUNK.NAME = "regnet"  # no depth rule (the model is built as a ViT)
    model = build_model(_cfg().MODEL, cfg.OPTIMIZER)
    with pytest.raises(ConfigError, match="regnet") as err:
        _build(cfg, model)
    assert err.value.key_path == "config.OPTIMIZER.param_group_constructor"
    with pytest.raises(ValueError, match="model_config"):
        build_optimizer(cfg.OPTIMIZER, model)
    with pytest.raises(ConfigError, match="construct_single_param_group_only"):
        _build(_cfg("config.OPTIMIZER.construct_single_param_group_only=True"))
    with pytest.raises(UnknownNameError, match="lr_decay"):
        _build(_cfg("config.OPTIMIZER.param_group_constructor=lr_decy"))


def test_dino_constructor() -> None:
    cfg = _cfg(
        "config.OPTIMIZER.param_group_constructor=dino", "config.OPTIMIZER.weight_decay=0.04"
    )
    model, schedules, optimizer = _build(cfg)
    groups = {g["param_group_name"]: g for g in optimizer.param_groups}
    assert set(groups) == {"regularized", "unregularized"}
    unreg = {id(p) for p in groups["unregularized"]["params"]}
    for name, param in model.named_parameters():
        assert (id(param) in unreg) == (name.endswith(".bias") or "norm" in name), name
    assert groups["regularized"]["weight_decay"] == 0.04
    schedules.apply(optimizer, 0.5, None)
    assert {g["lr"] for g in optimizer.param_groups} == {schedules.values(0.5)["lr"]}


def _two_head_model(cfg: Any) -> nn.Module:
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    model.trunk.requires_grad_(False)
    return model


HEADS = "config.MODEL.HEAD.PARAMS=[[[mlp,{dims:[32,10]}]],[[mlp,{dims:[32,16,10],use_bn:true}]]]"


def test_linear_eval_heads_give_each_head_its_rate_and_decay() -> None:
    cfg = _cfg(
        HEADS,
        "config.OPTIMIZER.param_group_constructor=linear_eval_heads",
        "config.OPTIMIZER.weight_decay=0.001",
        "config.OPTIMIZER.linear_eval_heads=[{lr: 0.5, weight_decay: 0.0005},"
        "{lr: 2.0, regularize_bn: true}]",
    )
    model = _two_head_model(cfg)
    _, schedules, optimizer = _build(cfg, model)
    schedules.apply(optimizer, 0.4, None)
    base = schedules.values(0.4)["lr"]
    groups = _group_of(optimizer)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert set(groups) == {id(p) for p in trainable.values()}
    for name, param in trainable.items():
        group = groups[id(param)]
        head = int(name.split(".")[1])
        assert group["lr"] == pytest.approx(base * (0.5, 2.0)[head]), name
        wd = (0.0005, 0.001)[head]
        # the first head regularizes every parameter (biases: regularize_bias); the
        # second also its BatchNorm (regularize_bn: true)
        assert group["weight_decay"] == wd, name


LEH = "config.OPTIMIZER.param_group_constructor=linear_eval_heads"


@pytest.mark.parametrize(
    ("entries", "key"),
    [
        ("[{lr: 1.0}]", "config.OPTIMIZER.linear_eval_heads"),
        ("[{lr: 1.0},{weight_decay: 0.1}]", "config.OPTIMIZER.linear_eval_heads[1].lr"),
        ("[{lr: 1.0},{lr: 1.0, decay: 0.1}]", "config.OPTIMIZER.linear_eval_heads[1].decay"),
        ("[{lr: 1.0},{lr: -1.0}]", "config.OPTIMIZER.linear_eval_heads[1].lr"),
    ],
)
def test_linear_eval_heads_errors_name_their_key(entries: str, key: str) -> None:
    cfg = _cfg(HEADS, LEH, f"config.OPTIMIZER.linear_eval_heads={entries}")
    with pytest.raises(ConfigError) as err:
        _build(cfg, _two_head_model(cfg))
    assert err.value.key_path == key


def test_registry_has_vissls_names_and_import_path() -> None:
    from vissl.optimizers.param_groups.registry import register_param_group_constructor

    assert {"default", "dino", "lr_decay", "linear_eval_heads"} <= set(
        PARAM_GROUP_CONSTRUCTOR_REGISTRY.names()
    )

    @register_param_group_constructor("test_halves")
    def halves(model: nn.Module, model_config: Any, optimizer_config: Any) -> list[dict]:
        return [{"params": list(model.parameters()), "weight_decay": 0.0, "lr_scale": 0.5}]

    try:
        cfg = _cfg("config.OPTIMIZER.param_group_constructor=test_halves")
        _, schedules, optimizer = _build(cfg)
        (group,) = optimizer.param_groups
        assert group["lr"] == schedules.values(0.0)["lr"] * 0.5
        assert group["is_head"] is False and group["param_group_name"] == "test_halves"
    finally:
        PARAM_GROUP_CONSTRUCTOR_REGISTRY.unregister("test_halves")


def test_default_groups_are_unchanged() -> None:
    _, schedules, optimizer = _build(_cfg("config.OPTIMIZER.param_group_constructor=default"))
    names = {g["param_group_name"] for g in optimizer.param_groups}
    assert names <= {
        "trunk_regularized",
        "trunk_unregularized",
        "head_regularized",
        "head_unregularized",
    }
    assert all(g["lr_scale"] == 1.0 for g in optimizer.param_groups)
    schedules.apply(optimizer, 0.2, None)
    assert {g["lr"] for g in optimizer.param_groups} == {schedules.values(0.2)["lr"]}

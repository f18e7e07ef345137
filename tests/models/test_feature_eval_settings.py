"""MODEL.FEATURE_EVAL_SETTINGS: frozen trunks, per-layer eval_mlp heads, trunk-and-head eval."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from omegaconf import OmegaConf

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.meters import build_meters
from vissl.models import BaseSSLMultiInputOutputModel, build_model
from vissl.models.trunks.feature_extractor import FeatureExtractorModel
from vissl.utils.weights_init import init_model_from_checkpoint

torch.set_num_threads(2)

_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL_DEFAULTS: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]

LAYERS = ["conv1", "res2", "res3", "res4", "res5", "res5avg"]
POOL_MAP = [
    ["conv1", ["AdaptiveAvgPool2d", [[2, 2]]]],
    ["res2", ["AdaptiveAvgPool2d", [[2, 2]]]],
    ["res3", ["AvgPool2d", [[2, 2], 2, 0]]],
    ["res4", ["AdaptiveMaxPool2d", [[1, 1]]]],
    ["res5", ["AdaptiveAvgPool2d", [[1, 1]]]],
    ["res5avg", ["Identity", []]],
]
SIMCLR_HEAD = [
    ["mlp", {"dims": [128, 128], "use_relu": True, "skip_last_layer_relu_bn": False}],
    ["mlp", {"dims": [128, 32]}],
]
NUM_CLASSES = 10
SIZE = 32


def model_config(**fe: Any) -> AttrDict:
    """config.MODEL (defaults) with a small ResNet-18 and the given FEATURE_EVAL_SETTINGS."""
    cfg = AttrDict(copy.deepcopy(_MODEL_DEFAULTS))
    cfg.TRUNK.RESNETS.DEPTH = 18
    cfg.TRUNK.RESNETS.WIDTH_MULTIPLIER = 0.25
    for key, value in fe.items():
        cfg.FEATURE_EVAL_SETTINGS[key] = value
    return cfg


def build(cfg: AttrDict) -> BaseSSLMultiInputOutputModel:
    model = build_model(cfg, AttrDict())
    assert isinstance(model, BaseSSLMultiInputOutputModel)
    return model


def images(n: int = 4) -> torch.Tensor:
    return torch.randn(n, 3, SIZE, SIZE)


def pooled_shapes() -> list[tuple[int, ...]]:
    """Shapes of the pooled (unflattened) features of POOL_MAP, measured on the trunk."""
    cfg = model_config(
        EVAL_MODE_ON=True,
        FREEZE_TRUNK_ONLY=True,
        EXTRACT_TRUNK_FEATURES_ONLY=True,
        SHOULD_FLATTEN_FEATS=False,
        LINEAR_EVAL_FEAT_POOL_OPS_MAP=POOL_MAP,
    )
    with torch.no_grad():
        return [tuple(f.shape[1:]) for f in build(cfg)(images(2))]


def linear_eval_config(**extra: Any) -> AttrDict:
    """VISSL-style linear evaluation: frozen trunk, one eval_mlp per tapped layer."""
    fe = dict(
        EVAL_MODE_ON=True,
        FREEZE_TRUNK_ONLY=True,
        SHOULD_FLATTEN_FEATS=False,
        LINEAR_EVAL_FEAT_POOL_OPS_MAP=POOL_MAP,
    )
    fe.update(extra)
    cfg = model_config(**fe)
    cfg.HEAD.PARAMS = [
        ["eval_mlp", {"in_channels": c, "dims": [c * h * w, NUM_CLASSES]}]
        for c, h, w in pooled_shapes()
    ]
    return cfg


def bn_stats(module: nn.Module) -> list[torch.Tensor]:
    return [
        t.clone()
        for m in module.modules()
        if isinstance(m, nn.BatchNorm2d)
        for t in (m.running_mean, m.running_var)
    ]


def test_linear_eval_on_several_layers_freezes_the_trunk_and_trains_the_heads() -> None:
    model = build(linear_eval_config())
    assert isinstance(model.trunk, FeatureExtractorModel)
    assert model.eval_mode
    assert len(model.heads) == len(LAYERS)
    assert not any(p.requires_grad for p in model.trunk.parameters())
    assert all(p.requires_grad for p in model.heads.parameters())

    model.train()
    assert not any(m.training for m in model.trunk.modules() if isinstance(m, nn.BatchNorm2d))
    assert all(head.training for head in model.heads)
    trunk_before = bn_stats(model.trunk)
    heads_before = bn_stats(model.heads)

    out = model(images())
    assert [tuple(o.shape) for o in out] == [(4, NUM_CLASSES)] * len(LAYERS)
    sum(o.sum() for o in out).backward()

    # frozen trunk: BN statistics unchanged, no gradients; heads: both updated
    assert all(torch.equal(a, b) for a, b in zip(trunk_before, bn_stats(model.trunk)))
    assert not all(torch.equal(a, b) for a, b in zip(heads_before, bn_stats(model.heads)))
    assert all(p.grad is None for p in model.trunk.parameters())
    assert all(p.grad is not None for p in model.heads.parameters())


def test_frozen_trunk_output_does_not_depend_on_train_mode() -> None:
    model = build(linear_eval_config(EXTRACT_TRUNK_FEATURES_ONLY=True))
    batch = images()
    model.eval()
    with torch.no_grad():
        expected = model(batch)
    model.train()
    with torch.no_grad():
        got = model(batch)
    assert all(torch.equal(a, b) for a, b in zip(expected, got))


def test_one_accuracy_list_meter_output_per_head() -> None:
    model = build(linear_eval_config())
    meters_cfg = AttrDict(
        {
            "names": ["accuracy_list_meter"],
            "accuracy_list_meter": {
                "num_meters": len(LAYERS),
                "topk_values": [1],
                "meter_names": LAYERS,
            },
        }
    )
    (meter,) = build_meters(meters_cfg)
    model.eval()
    with torch.no_grad():
        out = model(images(8))
    target = torch.randint(0, NUM_CLASSES, (8,))
    meter.update(out, target)
    value = meter.value["top_1"]
    assert sorted(value) == sorted(LAYERS)
    for i, name in enumerate(LAYERS):
        expected = (out[i].argmax(1) == target).float().mean().item() * 100
        assert value[name] == pytest.approx(expected)


def test_freeze_trunk_only_on_the_default_trunk_output() -> None:
    cfg = model_config(EVAL_MODE_ON=True, FREEZE_TRUNK_ONLY=True)
    cfg.HEAD.PARAMS = [["eval_mlp", {"in_channels": 128, "dims": [128, NUM_CLASSES]}]]
    model = build(cfg)
    assert not isinstance(model.trunk, FeatureExtractorModel)
    model.train()
    before = bn_stats(model.trunk)
    (out,) = model(images())
    out.sum().backward()
    assert out.shape == (4, NUM_CLASSES)
    assert all(torch.equal(a, b) for a, b in zip(before, bn_stats(model.trunk)))
    assert all(p.grad is None for p in model.trunk.parameters())
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.startswith("heads.") for n in trainable)


def test_freeze_trunk_and_head_freezes_everything() -> None:
    cfg = model_config(EVAL_MODE_ON=True, FREEZE_TRUNK_AND_HEAD=True)
    cfg.HEAD.PARAMS = SIMCLR_HEAD
    model = build(cfg)
    assert model.is_fully_frozen_model()
    model.train()
    assert not any(
        m.training for m in model.modules() if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d)
    )


def test_extract_trunk_features_only_returns_pooled_layers() -> None:
    cfg = linear_eval_config(EXTRACT_TRUNK_FEATURES_ONLY=True, SHOULD_FLATTEN_FEATS=True)
    model = build(cfg)
    feats = model(images())
    flat = [c * h * w for c, h, w in pooled_shapes()]
    assert [tuple(f.shape) for f in feats] == [(4, n) for n in flat]


def test_flags_without_eval_mode_on_are_reported(caplog: pytest.LogCaptureFixture) -> None:
    cfg = model_config(EVAL_TRUNK_AND_HEAD=True, EXTRACT_TRUNK_FEATURES_ONLY=True)
    cfg.HEAD.PARAMS = SIMCLR_HEAD
    with caplog.at_level(logging.WARNING):
        model = build(cfg)
    assert "EVAL_TRUNK_AND_HEAD/EXTRACT_TRUNK_FEATURES_ONLY have no effect" in caplog.text
    (out,) = model(images())
    assert out.shape == (4, 32)  # heads still applied: the flags were ignored


@pytest.mark.parametrize(
    ("fe", "heads", "match"),
    [
        (
            dict(EVAL_MODE_ON=True, EVAL_TRUNK_AND_HEAD=True, EXTRACT_TRUNK_FEATURES_ONLY=True),
            SIMCLR_HEAD,
            "contradict",
        ),
        (
            dict(EVAL_MODE_ON=True, FREEZE_TRUNK_AND_HEAD=True, EVAL_TRUNK_AND_HEAD=True),
            [],
            "HEAD.PARAMS is empty",
        ),
        (
            dict(
                EVAL_MODE_ON=True,
                FREEZE_TRUNK_ONLY=True,
                EVAL_TRUNK_AND_HEAD=True,
                LINEAR_EVAL_FEAT_POOL_OPS_MAP=POOL_MAP[-1:],
            ),
            SIMCLR_HEAD,
            "taps several trunk layers",
        ),
    ],
)
def test_eval_trunk_and_head_contradictions(
    fe: dict[str, Any], heads: list[Any], match: str
) -> None:
    cfg = model_config(**fe)
    cfg.HEAD.PARAMS = heads
    with pytest.raises(ConfigError, match=match) as info:
        build(cfg)
    assert info.value.key_path is not None
    assert info.value.key_path.startswith("config.MODEL.")


def test_eval_trunk_and_head_evaluates_the_loaded_pretraining_head() -> None:
    pre_cfg = model_config()
    pre_cfg.HEAD.PARAMS = SIMCLR_HEAD
    pretrained = build(pre_cfg)
    # make BN statistics non-trivial so that loading them is visible
    pretrained.train()
    with torch.no_grad():
        for _ in range(3):
            pretrained(images(8) * 2 + 1)
    checkpoint = {"classy_state_dict": {"base_model": pretrained.get_classy_state()}}

    cfg = model_config(EVAL_MODE_ON=True, FREEZE_TRUNK_AND_HEAD=True, EVAL_TRUNK_AND_HEAD=True)
    cfg.HEAD.PARAMS = SIMCLR_HEAD
    model = build(cfg)
    report = init_model_from_checkpoint(model, checkpoint, cfg.WEIGHTS_INIT, cfg)
    assert any(k.startswith("heads.") for k in report.loaded)
    assert report.heads_kept == []

    batch = images()
    pretrained.eval()
    model.train()  # frozen: still evaluates in eval mode
    with torch.no_grad():
        (expected,) = pretrained(batch)
        (got,) = model(batch)
    assert got.shape == (4, 32)
    assert torch.allclose(expected, got)


def test_eval_trunk_and_head_with_frozen_trunk_trains_the_loaded_head() -> None:
    cfg = model_config(EVAL_MODE_ON=True, FREEZE_TRUNK_ONLY=True, EVAL_TRUNK_AND_HEAD=True)
    cfg.HEAD.PARAMS = SIMCLR_HEAD
    model = build(cfg)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.startswith("heads.") for n in trainable)


def test_bad_pool_op_arguments_name_the_key() -> None:
    cfg = model_config(
        EVAL_MODE_ON=True,
        FREEZE_TRUNK_ONLY=True,
        LINEAR_EVAL_FEAT_POOL_OPS_MAP=[["res5", ["AvgPool2d", [[1, 1], 1, 0, True, True, 1, 7]]]],
    )
    cfg.HEAD.PARAMS = [["eval_mlp", {"in_channels": 128, "dims": [128, NUM_CLASSES]}]]
    with pytest.raises(ConfigError, match="AvgPool2d cannot be built") as info:
        build(cfg)
    assert info.value.key_path == "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP"


@pytest.mark.parametrize(
    ("head", "match"),
    [
        ({"in_channels": 128, "dims": [999, NUM_CLASSES]}, r"dims\[0\] to 128"),
        ({"in_channels": 64, "dims": [128, NUM_CLASSES]}, "in_channels to 128"),
        ({"in_channels": 32, "dims": [512, NUM_CLASSES]}, "SHOULD_FLATTEN_FEATS: False"),
    ],
)
def test_eval_mlp_size_mismatch_says_what_to_set(head: dict[str, Any], match: str) -> None:
    flat = "SHOULD" in match
    cfg = model_config(
        EVAL_MODE_ON=True,
        FREEZE_TRUNK_ONLY=True,
        SHOULD_FLATTEN_FEATS=flat,
        LINEAR_EVAL_FEAT_POOL_OPS_MAP=[
            ["res4", ["AdaptiveAvgPool2d", [[2, 2]]]] if flat else ["res5avg", ["Identity", []]]
        ],
    )
    cfg.HEAD.PARAMS = [["eval_mlp", head]]
    with pytest.raises(ConfigError, match=match):  # found when the model is built
        build(cfg)

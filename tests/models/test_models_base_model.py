"""BaseSSLMultiInputOutputModel: head semantics, multi-crop input, freezing, errors."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from omegaconf import OmegaConf

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import MODEL_REGISTRY, BaseSSLMultiInputOutputModel, build_model
from vissl.models.trunks.feature_extractor import FeatureExtractorModel

torch.set_num_threads(2)

_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL_DEFAULTS: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]

DIM = 128  # ResNet-18 at WIDTH_MULTIPLIER 0.25


def model_config(head_params: list[Any] | None = None) -> AttrDict:
    """config.MODEL from defaults.yaml with a small ResNet-18 trunk."""
    cfg = AttrDict(copy.deepcopy(_MODEL_DEFAULTS))
    cfg.TRUNK.RESNETS.DEPTH = 18
    cfg.TRUNK.RESNETS.WIDTH_MULTIPLIER = 0.25
    if head_params is not None:
        cfg.HEAD.PARAMS = head_params
    return cfg


def build(cfg: AttrDict) -> BaseSSLMultiInputOutputModel:
    model = build_model(cfg, AttrDict())
    assert isinstance(model, BaseSSLMultiInputOutputModel)
    return model


def x(size: int = 16, n: int = 2) -> torch.Tensor:
    return torch.randn(n, 3, size, size)


def test_registry_and_default_name() -> None:
    assert "multi_input_output_model" in MODEL_REGISTRY
    cfg = model_config()
    del cfg["BASE_MODEL_NAME"]
    model = build(cfg)
    keys = list(model.state_dict())
    assert all(k.startswith(("trunk.", "heads.")) for k in keys)
    assert "trunk._feature_blocks.conv1.weight" in keys


def test_empty_params_output_is_trunk_feature() -> None:
    model = build(model_config([])).eval()
    inp = x()
    out = model(inp)
    assert len(out) == 1 and out[0].shape == (2, DIM)
    assert torch.equal(out[0], model.trunk(inp)[0])


def test_flat_params_is_a_chain() -> None:
    model = build(model_config([["mlp", {"dims": [DIM, 64]}], ["mlp", {"dims": [64, 8]}]])).eval()
    assert len(model.heads) == 2 and model.head_names == ["mlp", "mlp"]
    assert "heads.1.clf.0.weight" in model.state_dict()
    inp = x()
    out = model(inp)
    assert len(out) == 1 and out[0].shape == (2, 8)
    assert torch.allclose(out[0], model.heads[1](model.heads[0](model.trunk(inp)[0])))


def test_list_of_chains_gives_parallel_heads() -> None:
    params = [
        [["mlp", {"dims": [DIM, 16]}]],
        [["mlp", {"dims": [DIM, 64], "use_relu": True}], ["mlp", {"dims": [64, 8]}]],
    ]
    model = build(model_config(params)).eval()
    assert model.head_names == ["mlp", "mlp->mlp"]
    assert "heads.1.1.clf.0.weight" in model.state_dict()
    inp = x()
    out = model(inp)
    assert [o.shape for o in out] == [(2, 16), (2, 8)]
    feat = model.trunk(inp)[0]
    assert torch.allclose(out[0], model.heads[0](feat))
    assert torch.allclose(out[1], model.heads[1](feat))


def linear_eval_config() -> AttrDict:
    cfg = model_config(
        [
            ["eval_mlp", {"in_channels": 64, "dims": [64, 10]}],
            ["eval_mlp", {"in_channels": DIM, "dims": [DIM, 10]}],
        ]
    )
    fe = cfg.FEATURE_EVAL_SETTINGS
    fe.EVAL_MODE_ON = True
    fe.FREEZE_TRUNK_ONLY = True
    fe.SHOULD_FLATTEN_FEATS = False
    fe.LINEAR_EVAL_FEAT_POOL_OPS_MAP = [
        ["res4", ["AdaptiveAvgPool2d", [[1, 1]]]],
        ["res5avg", ["Identity", []]],
    ]
    return cfg


def test_one_head_per_trunk_feature() -> None:
    model = build(linear_eval_config())
    assert isinstance(model.trunk, FeatureExtractorModel)
    assert "trunk.base_model._feature_blocks.conv1.weight" in model.state_dict()
    model.train()
    assert not model.trunk.base_model.training and model.heads.training
    inp = x()
    out = model(inp)
    assert [o.shape for o in out] == [(2, 10), (2, 10)]
    feats = model.get_features(inp)
    assert [f.shape for f in feats] == [(2, 64, 1, 1), (2, DIM, 1, 1)]
    assert not any(p.requires_grad for p in model.trunk.parameters())
    assert all(p.requires_grad for p in model.heads.parameters())
    out[0].sum().backward()


def test_head_count_must_match_trunk_features() -> None:
    cfg = linear_eval_config()
    cfg.HEAD.PARAMS = [["eval_mlp", {"in_channels": 64, "dims": [64, 10]}]] * 3
    with pytest.raises(ConfigError) as e:
        build(cfg)
    assert e.value.key_path == "config.MODEL.HEAD.PARAMS"


def test_extract_trunk_features_only() -> None:
    cfg = linear_eval_config()
    cfg.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY = True
    out = build(cfg)(x())
    assert [o.shape for o in out] == [(2, 64, 1, 1), (2, DIM, 1, 1)]


@pytest.mark.parametrize(
    "params",
    [
        "mlp",
        [["mlp", 3]],
        [[1, {"dims": [2, 2]}]],
        [["mlp", {"dims": [DIM, 8]}, "extra"]],
        [[["mlp", {"dims": [DIM, 8]}], "identity"]],
        {"mlp": {"dims": [DIM, 8]}},
    ],
)
def test_bad_head_params_shape(params: Any) -> None:
    cfg = model_config()
    cfg.HEAD.PARAMS = params
    with pytest.raises(ConfigError) as e:
        build(cfg)
    assert e.value.key_path == "config.MODEL.HEAD.PARAMS"
    assert "config.MODEL.HEAD.PARAMS" in str(e.value)
    assert '[["mlp", {"dims": [2048, 128]}]]' in str(e.value)


def test_multi_resolution_list_input_matches_per_resolution_runs() -> None:
    model = build(model_config([["mlp", {"dims": [DIM, 8]}]]))
    calls: list[tuple[int, ...]] = []
    model.trunk.register_forward_pre_hook(lambda _m, args: calls.append(tuple(args[0].shape)))
    big = [x(32) for _ in range(2)]
    small = [x(16) for _ in range(2)]
    for mode in (False, True):  # eval, then train (BN statistics per resolution group)
        model.train(mode)
        calls.clear()
        torch.manual_seed(0)
        out = model(big + small)
        assert calls == [(4, 3, 32, 32), (4, 3, 16, 16)]
        assert len(out) == 1 and out[0].shape == (8, 8)
        feats = torch.cat([model.trunk(torch.cat(big))[0], model.trunk(torch.cat(small))[0]])
        assert torch.allclose(out[0], model.heads[0](feats), atol=1e-5)


def test_multi_resolution_order_and_single_pass() -> None:
    cfg = model_config([])
    model = build(cfg).eval()
    calls: list[int] = []
    model.trunk.register_forward_pre_hook(lambda _m, args: calls.append(args[0].shape[-1]))
    crops = [x(32, 1), x(16, 1), x(32, 1)]
    out = model(crops)[0]
    assert calls == [32, 16, 32]
    for i, crop in enumerate(crops):
        assert torch.allclose(out[i : i + 1], model.trunk(crop)[0], atol=1e-5)
    cfg.SINGLE_PASS_EVERY_CROP = True
    model = build(cfg).eval()
    calls.clear()
    model.trunk.register_forward_pre_hook(lambda _m, args: calls.append(args[0].shape[-1]))
    model([x(16), x(16)])
    assert calls == [16, 16]


def bn_stats(module: nn.Module) -> list[torch.Tensor]:
    return [m.running_mean.clone() for m in module.modules() if isinstance(m, nn.BatchNorm2d)]


def test_freeze_trunk_only() -> None:
    cfg = model_config([["mlp", {"dims": [DIM, 8], "use_bn": True}]])
    cfg.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON = True
    cfg.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY = True
    model = build(cfg)
    model.train()
    assert not model.trunk.training and model.heads.training and model.training
    assert not any(p.requires_grad for p in model.trunk.parameters())
    assert all(p.requires_grad for p in model.heads.parameters())
    before = bn_stats(model.trunk)
    model(x()).pop().sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(before, bn_stats(model.trunk)))
    assert model.heads[0].clf[0].weight.grad is not None
    assert not model.is_fully_frozen_model()


def test_freeze_trunk_and_head() -> None:
    cfg = model_config([["mlp", {"dims": [DIM, 8], "use_bn": True}]])
    cfg.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON = True
    cfg.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_AND_HEAD = True
    model = build(cfg).train()
    assert not model.trunk.training and not model.heads.training
    assert model.is_fully_frozen_model()


def test_non_trainable_params() -> None:
    cfg = model_config([["mlp", {"dims": [DIM, 8]}]])
    cfg.NON_TRAINABLE_PARAMS = ["trunk._feature_blocks.conv1.weight", "heads.0"]
    model = build(cfg)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {
        "trunk._feature_blocks.conv1.weight",
        "heads.0.clf.0.weight",
        "heads.0.clf.0.bias",
    }
    cfg.NON_TRAINABLE_PARAMS = ["trunk.feature_blocks.conv1.weight"]
    with pytest.raises(ConfigError) as e:
        build(cfg)
    assert e.value.key_path == "config.MODEL.NON_TRAINABLE_PARAMS"
    assert "trunk._feature_blocks.conv1.weight" in str(e.value)


def test_classy_state_roundtrip() -> None:
    params = [["mlp", {"dims": [DIM, 8]}]]
    a, b = build(model_config(params)).eval(), build(model_config(params)).eval()
    b.set_classy_state(a.get_classy_state(deep_copy=True))
    inp = x(16)
    assert torch.equal(a(inp)[0], b(inp)[0])
    assert not a.is_clustering_model()


def test_regnet_model_with_cpu_test_heads() -> None:
    cfg = model_config(
        [["mlp", {"dims": [368, 368], "use_relu": True}], ["mlp", {"dims": [368, 128]}]]
    )
    cfg.TRUNK.NAME = "regnet"
    cfg.TRUNK.REGNET = {"depth": 13, "w_0": 24, "w_a": 35.5, "w_m": 2.49, "group_width": 8}
    out = build(cfg)([x(16), x(16)])
    assert len(out) == 1 and out[0].shape == (4, 128)


def test_multi_input_head_mapping_not_supported() -> None:
    cfg = model_config()
    cfg.MULTI_INPUT_HEAD_MAPPING = [["patches", ["res5"]]]
    with pytest.raises(ConfigError) as e:
        build(cfg)
    assert e.value.key_path == "config.MODEL.MULTI_INPUT_HEAD_MAPPING"

"""Heads: mlp, eval_mlp, identity; argument errors."""

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
from vissl.errors import ConfigError, UnknownNameError
from vissl.models import build_model
from vissl.models.heads import MODEL_HEADS_REGISTRY, get_model_head

torch.set_num_threads(2)

_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL_DEFAULTS: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]


def model_config(head_params: list[Any] | None = None) -> AttrDict:
    cfg = AttrDict(copy.deepcopy(_MODEL_DEFAULTS))
    cfg.TRUNK.RESNETS.DEPTH = 18
    cfg.TRUNK.RESNETS.WIDTH_MULTIPLIER = 0.25
    if head_params is not None:
        cfg.HEAD.PARAMS = head_params
    return cfg


def mlp(**kwargs: Any) -> nn.Module:
    return get_model_head("mlp")(model_config(), **kwargs)


def layer_types(head: nn.Module) -> list[type[nn.Module]]:
    return [type(m) for m in head.clf]


def test_registered_heads() -> None:
    assert {"mlp", "identity", "eval_mlp"} <= set(MODEL_HEADS_REGISTRY.names())


def test_mlp_layers() -> None:
    assert layer_types(mlp(dims=[8, 4])) == [nn.Linear]
    head = mlp(dims=[8, 16, 4], use_bn=True, use_relu=True, use_dropout=True)
    assert layer_types(head) == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Dropout, nn.Linear]
    head = mlp(dims=[8, 16, 4], use_relu=True, skip_last_layer_relu_bn=False)
    assert layer_types(head) == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU]
    assert mlp(dims=[8, 4], use_bias=False).clf[0].bias is None


def test_mlp_batchnorm_settings_from_config() -> None:
    cfg = model_config()
    cfg.HEAD.BATCHNORM_EPS = 1e-3
    cfg.HEAD.BATCHNORM_MOMENTUM = 0.01
    head = get_model_head("mlp")(cfg, dims=[8, 16, 4], use_bn=True)
    assert head.clf[1].eps == 1e-3 and head.clf[1].momentum == 0.01


def test_mlp_inputs() -> None:
    head = mlp(dims=[8, 4])
    feat = torch.randn(2, 8)
    out = head(feat)
    assert out.shape == (2, 4)
    assert torch.equal(head(feat[:, :, None, None]), out)
    assert torch.equal(head([feat]), out)


def test_mlp_params_multiplier() -> None:
    cfg = model_config()
    cfg.HEAD.PARAMS_MULTIPLIER = 0.5
    torch.manual_seed(0)
    ref = get_model_head("mlp")(model_config(), dims=[8, 4])
    torch.manual_seed(0)
    scaled = get_model_head("mlp")(cfg, dims=[8, 4])
    assert torch.allclose(scaled.clf[0].weight, ref.clf[0].weight * 0.5)
    assert torch.allclose(scaled.clf[0].bias, ref.clf[0].bias * 0.5)


def test_mlp_bad_dims() -> None:
    for dims in ([8], "8,4", [8, -1], None):
        with pytest.raises(ConfigError) as e:
            mlp(dims=dims)
        assert e.value.key_path == "config.MODEL.HEAD.PARAMS"


def test_eval_mlp() -> None:
    head = get_model_head("eval_mlp")(model_config(), in_channels=8, dims=[8, 3])
    assert isinstance(head.channel_bn, nn.BatchNorm2d)
    assert head(torch.randn(2, 8, 1, 1)).shape == (2, 3)
    assert head(torch.randn(2, 8)).shape == (2, 3)
    head = get_model_head("eval_mlp")(model_config(), in_channels=2, dims=[8, 3])
    assert head(torch.randn(2, 2, 2, 2)).shape == (2, 3)


def test_identity_head() -> None:
    head = get_model_head("identity")(model_config())
    feat = torch.randn(2, 8)
    assert head(feat) is feat


def test_unknown_head_kwarg_is_config_error() -> None:
    cfg = model_config([["mlp", {"dims": [128, 8], "use_batchnorm": True}]])
    with pytest.raises(ConfigError) as e:
        build_model(cfg, AttrDict())
    msg = str(e.value)
    assert e.value.key_path == "config.MODEL.HEAD.PARAMS"
    assert "config.MODEL.HEAD.PARAMS" in msg and "use_batchnorm" in msg and "use_bn" in msg


def test_missing_head_kwarg_is_config_error() -> None:
    with pytest.raises(ConfigError) as e:
        build_model(model_config([["mlp", {}]]), AttrDict())
    assert "dims" in str(e.value)


def test_unknown_head_name() -> None:
    with pytest.raises(UnknownNameError) as e:
        build_model(model_config([["mpl", {"dims": [128, 8]}]]), AttrDict())
    msg = str(e.value)
    assert "model head" in msg and "Did you mean 'mlp'" in msg and "'identity'" in msg


def test_mlp_last_bn_is_a_batchnorm_alone_after_the_last_linear() -> None:
    """``last_bn``: the projectors of SimSiam and MoCo v3 (BN without affine) and NNCLR
    (affine) end in a BatchNorm1d with no ReLU after it, which no VISSL setting gives."""
    head = mlp(dims=[8, 16, 4], use_bn=True, use_relu=True, use_bias=False, last_bn=True)
    assert layer_types(head) == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear, nn.BatchNorm1d]
    assert head.clf[-1].num_features == 4 and head.clf[-1].affine
    head = mlp(dims=[8, 4], last_bn=True, last_bn_affine=False)
    assert layer_types(head) == [nn.Linear, nn.BatchNorm1d]
    last = head.clf[-1]
    assert not last.affine and last.weight is None and last.bias is None
    # the output of a training-mode forward is standardised per feature, and not clipped
    out = head.train()(torch.randn(64, 8) * 3 + 5)
    torch.testing.assert_close(out.mean(0), torch.zeros(4), atol=1e-5, rtol=0)
    assert (out < 0).any()
    cfg = model_config()
    cfg.HEAD.BATCHNORM_EPS = 1e-3
    cfg.HEAD.BATCHNORM_MOMENTUM = 0.01
    head = get_model_head("mlp")(cfg, dims=[8, 4], last_bn=True)
    assert head.clf[-1].eps == 1e-3 and head.clf[-1].momentum == 0.01
    # the default is VISSL's layout
    assert layer_types(mlp(dims=[8, 16, 4], use_bn=True)) == [nn.Linear, nn.BatchNorm1d, nn.Linear]


def test_mlp_use_bias_per_linear_layer() -> None:
    """``use_bias`` as a list, one per Linear: BYOL's MLP drops the last layer's bias,
    SimSiam's predictor the first's; a bool still sets them all."""
    linears = [
        m
        for m in mlp(dims=[8, 16, 4], use_bias=[False, True]).modules()
        if isinstance(m, nn.Linear)
    ]
    assert [m.bias is not None for m in linears] == [False, True]
    linears = [
        m for m in mlp(dims=[8, 16, 4], use_bias=False).modules() if isinstance(m, nn.Linear)
    ]
    assert [m.bias is not None for m in linears] == [False, False]


@pytest.mark.parametrize("use_bias", [[True], [True, False, True], "no", [1, 0]])
def test_mlp_bad_use_bias_is_a_config_error(use_bias: object) -> None:
    with pytest.raises(ConfigError, match="one per Linear layer") as err:
        mlp(dims=[8, 16, 4], use_bias=use_bias)
    assert err.value.key_path == "config.MODEL.HEAD.PARAMS"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"last_bn": True, "skip_last_layer_relu_bn": False}, "skip_last_layer_relu_bn: True"),
        ({"last_bn_affine": False}, "without `last_bn: True`"),
        ({"last_bn": "yes"}, "`last_bn` true or false"),
        ({"last_bn": True, "last_bn_affine": 0}, "`last_bn_affine` true or false"),
    ],
)
def test_mlp_contradictory_last_bn_settings_are_config_errors(
    kwargs: dict[str, Any], match: str
) -> None:
    cfg = model_config([["mlp", {"dims": [128, 16, 8], "use_bn": True, **kwargs}]])
    with pytest.raises(ConfigError, match=match) as e:
        build_model(cfg, AttrDict())
    assert e.value.key_path == "config.MODEL.HEAD.PARAMS"


# heads whose arguments are a typed dataclass: registry name -> "module:Params class"
_HEAD_PARAMS = {
    "dino_head": "vissl.models.heads.dino_head:DINOHeadParams",
    "ibot_head": "vissl.models.heads.ibot_head:IBOTHeadParams",
    "ijepa_predictor": "vissl.models.heads.ijepa_predictor:IJEPAPredictorParams",
    "mae_decoder": "vissl.models.heads.mae_decoder:MAEDecoderParams",
    "msn_head": "vissl.models.heads.msn_head:MSNHeadParams",
    "swav_head": "vissl.models.heads.swav_head:SwAVHeadParams",
    "vision_transformer_head": (
        "vissl.models.heads.vision_transformer_head:VisionTransformerHeadParams"
    ),
}


def _head_params(name: str) -> type:
    import importlib

    module, _, cls = _HEAD_PARAMS[name].partition(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", sorted(_HEAD_PARAMS))
def test_a_typed_heads_signature_is_its_params(name: str) -> None:
    """The constructor takes the dataclass's arguments with its defaults (stated once)."""
    import dataclasses
    import inspect

    fields = {f.name: f for f in dataclasses.fields(_head_params(name))}
    params = list(inspect.signature(get_model_head(name)).parameters.values())[1:]
    assert [p.name for p in params] == list(fields)
    for p in params:
        default = fields[p.name].default
        expected = inspect.Parameter.empty if default is dataclasses.MISSING else default
        assert p.default == expected, p.name


@pytest.mark.parametrize(
    ("name", "kwargs", "key"),
    [
        ("dino_head", {"in_dim": 8, "use_bn": "yes"}, "use_bn"),
        ("ibot_head", {"in_dim": 8, "out_dim": 4, "norm": "gn"}, "norm"),
        (
            "ibot_head",
            {"in_dim": 8, "out_dim": 4, "patch_out_dim": 3, "shared_head": True},
            "patch_out_dim",
        ),
        ("ijepa_predictor", {"in_dim": 8, "predictor_dim": 10, "num_heads": 2}, "predictor_dim"),
        ("ijepa_predictor", {"in_dim": 8, "drop_path_rate": 1.0}, "drop_path_rate"),
        ("mae_decoder", {"in_dim": 8, "decoder_mlp_dim": 0}, "decoder_mlp_dim"),
        ("msn_head", {"in_dim": 8, "temperature": "hot"}, "temperature"),
        ("swav_head", {"dims": [8, 4], "activation_name": "Tanh"}, "activation_name"),
        ("swav_head", {"dims": [8, 4], "num_clusters": [3, 0]}, "num_clusters[1]"),
        ("vision_transformer_head", {"in_plane": 8, "num_classes": True}, "num_classes"),
    ],
)
def test_typed_head_arguments_are_refused_by_key(
    name: str, kwargs: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError) as err:
        get_model_head(name)({}, **kwargs)
    assert err.value.key_path == f"config.MODEL.HEAD.PARAMS[{name}].{key}"

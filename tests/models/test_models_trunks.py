"""Trunks: resnet (ResNe(X)t) and regnet shapes, options, feature names and errors."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from omegaconf import OmegaConf
from torchvision.models.resnet import BasicBlock, Bottleneck
from torchvision.ops import SqueezeExcitation

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError, UnknownNameError
from vissl.models import build_model
from vissl.models.model_helpers import LayerNorm2d, StandardizedConv2d
from vissl.models.trunks import MODEL_TRUNKS_REGISTRY, get_model_trunk
from vissl.models.trunks.regnet import regnet_stage_params

torch.set_num_threads(2)

_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL_DEFAULTS: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]

CPU_TEST_REGNET = {"depth": 13, "w_0": 24, "w_a": 35.5, "w_m": 2.49, "group_width": 8}


def model_config(**resnets: Any) -> AttrDict:
    """config.MODEL from defaults.yaml, with RESNETS overrides."""
    cfg = AttrDict(copy.deepcopy(_MODEL_DEFAULTS))
    cfg.TRUNK.RESNETS.update(resnets)
    return cfg


def resnet(**resnets: Any) -> nn.Module:
    return get_model_trunk("resnet")(model_config(**resnets), "resnet")


def regnet(**params: Any) -> nn.Module:
    cfg = model_config()
    cfg.TRUNK.NAME = "regnet"
    cfg.TRUNK.REGNET = params
    return get_model_trunk("regnet")(cfg, "regnet")


def x(size: int = 32) -> torch.Tensor:
    return torch.randn(2, 3, size, size)


# ------------------------------------------------------------------------------ resnet
@pytest.mark.parametrize(("depth", "dim"), [(18, 512), (50, 2048)])
def test_resnet_default_output_is_flattened_res5avg(depth: int, dim: int) -> None:
    trunk = resnet(DEPTH=depth)
    for size in (32, 16) if depth == 18 else (16,):
        out = trunk(x(size))
        assert isinstance(out, list) and len(out) == 1
        assert out[0].shape == (2, dim)
    block = BasicBlock if depth < 50 else Bottleneck
    assert isinstance(trunk._feature_blocks.layer1[0], block)


@pytest.mark.parametrize(
    ("depth", "blocks", "dim"),
    [(34, [3, 4, 6, 3], 512), (101, [3, 4, 23, 3], 2048), (152, [3, 8, 36, 3], 2048)],
)
def test_resnet_structure_other_depths(depth: int, blocks: list[int], dim: int) -> None:
    with torch.device("meta"):  # structure only: no real init cost
        trunk = resnet(DEPTH=depth)
        assert trunk(torch.empty(2, 3, 16, 16))[0].shape == (2, dim)
    assert [len(trunk._feature_blocks[f"layer{i}"]) for i in range(1, 5)] == blocks


def test_resnet_width_multiplier() -> None:
    trunk = resnet(DEPTH=18, WIDTH_MULTIPLIER=0.5)
    assert trunk._feature_blocks.conv1.out_channels == 32
    assert trunk(x(16))[0].shape == (2, 256)
    with torch.device("meta"):
        trunk = resnet(DEPTH=50, WIDTH_MULTIPLIER=2)
        assert trunk(torch.empty(2, 3, 16, 16))[0].shape == (2, 4096)
    assert trunk._feature_blocks.conv1.out_channels == 128
    assert trunk._feature_blocks.layer4[0].conv2.out_channels == 1024
    with pytest.raises(ConfigError) as e:
        resnet(WIDTH_MULTIPLIER=0.3)
    assert e.value.key_path == "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER"


def test_resnext_groups() -> None:
    with torch.device("meta"):
        trunk = resnet(DEPTH=50, GROUPS=32, WIDTH_PER_GROUP=4)
    block = trunk._feature_blocks.layer1[0]
    assert block.conv2.groups == 32
    assert block.conv2.in_channels == 128  # 64 * (4 / 64) * 32
    trunk = resnet(DEPTH=50, GROUPS=8, WIDTH_PER_GROUP=4, WIDTH_MULTIPLIER=0.25)
    assert trunk._feature_blocks.layer1[0].conv2.groups == 8
    assert trunk(x(16))[0].shape == (2, 512)


def test_basicblock_rejects_groups() -> None:
    with pytest.raises(ConfigError) as e:
        resnet(DEPTH=18, GROUPS=32, WIDTH_PER_GROUP=4)
    assert "BasicBlock" in str(e.value)


@pytest.mark.parametrize(
    ("norm", "cls"),
    [("BatchNorm", nn.BatchNorm2d), ("GroupNorm", nn.GroupNorm), ("LayerNorm", LayerNorm2d)],
)
def test_resnet_norms(norm: str, cls: type[nn.Module]) -> None:
    trunk = resnet(DEPTH=18, NORM=norm, GROUPNORM_GROUPS=8, WIDTH_MULTIPLIER=0.25)
    assert isinstance(trunk._feature_blocks.bn1, cls)
    assert isinstance(trunk._feature_blocks.layer2[0].downsample[1], cls)
    if norm == "GroupNorm":
        assert trunk._feature_blocks.bn1.num_groups == 8
    if norm == "LayerNorm":
        assert trunk._feature_blocks.bn1.num_groups == 1
    assert trunk(x(16))[0].shape == (2, 128)


def test_bad_norm_names_key_and_allowed_values() -> None:
    with pytest.raises(ConfigError) as e:
        resnet(NORM="InstanceNorm")
    assert e.value.key_path == "config.MODEL.TRUNK.RESNETS.NORM"
    assert "config.MODEL.TRUNK.RESNETS.NORM" in str(e.value)
    assert "GroupNorm" in str(e.value) and "LayerNorm" in str(e.value)


def test_bad_depth_names_key_and_allowed_values() -> None:
    with pytest.raises(ConfigError) as e:
        resnet(DEPTH=42)
    assert e.value.key_path == "config.MODEL.TRUNK.RESNETS.DEPTH"
    assert "config.MODEL.TRUNK.RESNETS.DEPTH" in str(e.value)
    for depth in (18, 34, 50, 101, 152):
        assert str(depth) in str(e.value)


def test_bad_layer4_stride_and_groupnorm_groups() -> None:
    with pytest.raises(ConfigError) as e:
        resnet(DEPTH=18, LAYER4_STRIDE=3)
    assert e.value.key_path == "config.MODEL.TRUNK.RESNETS.LAYER4_STRIDE"
    with pytest.raises(ConfigError) as e:
        resnet(DEPTH=18, NORM="GroupNorm", GROUPNORM_GROUPS=7)
    assert e.value.key_path == "config.MODEL.TRUNK.RESNETS.GROUPNORM_GROUPS"


@pytest.mark.parametrize(("depth", "attr"), [(18, "bn2"), (50, "bn3")])
def test_zero_init_residual(depth: int, attr: str) -> None:
    trunk = resnet(DEPTH=depth, ZERO_INIT_RESIDUAL=True, WIDTH_MULTIPLIER=0.25)
    blocks = [b for i in range(1, 5) for b in trunk._feature_blocks[f"layer{i}"]]
    assert all(torch.count_nonzero(getattr(b, attr).weight) == 0 for b in blocks)
    assert torch.all(blocks[0].bn1.weight == 1)
    trunk = resnet(DEPTH=depth, ZERO_INIT_RESIDUAL=False, WIDTH_MULTIPLIER=0.25)
    blocks = [b for i in range(1, 5) for b in trunk._feature_blocks[f"layer{i}"]]
    assert all(torch.all(getattr(b, attr).weight == 1) for b in blocks)


def test_resnet_feature_names_and_order() -> None:
    trunk = resnet(DEPTH=18).eval()
    names = ["res5", "conv1", "res1", "res2", "res3", "res4", "res5avg", "flatten"]
    feats = trunk(x(32), names)
    shapes = [tuple(f.shape) for f in feats]
    assert shapes == [
        (2, 512, 1, 1),
        (2, 64, 16, 16),
        (2, 64, 8, 8),
        (2, 64, 8, 8),
        (2, 128, 4, 4),
        (2, 256, 2, 2),
        (2, 512, 1, 1),
        (2, 512),
    ]
    assert torch.equal(feats[6].flatten(1), feats[7])
    with pytest.raises(ConfigError) as e:
        trunk(x(32), ["res6"])
    assert "res5avg" in str(e.value)


def test_resnet_layer4_stride_one() -> None:
    trunk = resnet(DEPTH=18, LAYER4_STRIDE=1, WIDTH_MULTIPLIER=0.25)
    res4, res5 = trunk(x(32), ["res4", "res5"])
    assert res4.shape[-2:] == res5.shape[-2:]


def test_resnet_small_image_stem() -> None:
    trunk = resnet(DEPTH=18, SMALL_IMAGE_STEM=True, WIDTH_MULTIPLIER=0.25).eval()
    conv1 = trunk._feature_blocks.conv1
    assert (conv1.kernel_size, conv1.stride, conv1.padding) == ((3, 3), (1, 1), (1, 1))
    assert not any(isinstance(m, nn.MaxPool2d) for m in trunk.modules())
    conv, res1, res5, flat = trunk(x(32), ["conv1", "res1", "res5", "flatten"])
    assert conv.shape == (2, 16, 32, 32)
    assert torch.equal(conv, res1)  # no max-pool: res1 is the stem output
    assert res5.shape == (2, 128, 4, 4)
    assert flat.shape == (2, 128)
    # same block names and parameter keys as the standard stem: checkpoints interchange
    default = resnet(DEPTH=18, WIDTH_MULTIPLIER=0.25)
    assert list(trunk._feature_blocks) == list(default._feature_blocks)
    assert set(trunk.state_dict()) == set(default.state_dict())
    with pytest.raises(ConfigError) as e:
        resnet(SMALL_IMAGE_STEM="yes")
    assert e.value.key_path == "config.MODEL.TRUNK.RESNETS.SMALL_IMAGE_STEM"


def test_resnet_default_stem_unchanged() -> None:
    assert _MODEL_DEFAULTS["TRUNK"]["RESNETS"]["SMALL_IMAGE_STEM"] is False
    trunk = resnet(DEPTH=18, WIDTH_MULTIPLIER=0.25)
    conv1 = trunk._feature_blocks.conv1
    assert (conv1.kernel_size, conv1.stride, conv1.padding) == ((7, 7), (2, 2), (3, 3))
    assert isinstance(trunk._feature_blocks.maxpool, nn.MaxPool2d)
    assert trunk(x(32), ["res5"])[0].shape == (2, 128, 1, 1)


def test_resnet_lab_and_bgr_inputs() -> None:
    cfg = model_config(DEPTH=18, WIDTH_MULTIPLIER=0.25)
    cfg.INPUT_TYPE = "lab"
    trunk = get_model_trunk("resnet")(cfg, "resnet")
    assert trunk._feature_blocks.conv1.in_channels == 1
    assert trunk(x(16))[0].shape == (2, 128)
    cfg.INPUT_TYPE = "hsv"
    with pytest.raises(ConfigError) as e:
        get_model_trunk("resnet")(cfg, "resnet")
    assert e.value.key_path == "config.MODEL.INPUT_TYPE"


def test_resnet_state_dict_keys_match_vissl() -> None:
    with torch.device("meta"):
        keys = set(resnet(DEPTH=50).state_dict())
    for key in (
        "_feature_blocks.conv1.weight",
        "_feature_blocks.bn1.running_mean",
        "_feature_blocks.layer1.0.conv3.weight",
        "_feature_blocks.layer1.0.downsample.0.weight",
        "_feature_blocks.layer4.2.bn3.bias",
    ):
        assert key in keys


def test_resnet_activation_checkpointing_same_result() -> None:
    torch.manual_seed(0)
    plain = resnet(DEPTH=18, WIDTH_MULTIPLIER=0.25)
    cfg = model_config(DEPTH=18, WIDTH_MULTIPLIER=0.25)
    cfg.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING = True
    cfg.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS = 3
    ckpt = get_model_trunk("resnet")(cfg, "resnet")
    ckpt.load_state_dict(plain.state_dict())
    inp = x(16)
    a = plain(inp, ["res3", "flatten"])
    b = ckpt(inp, ["res3", "flatten"])
    assert all(torch.allclose(p, q, atol=1e-5) for p, q in zip(a, b))
    a[1].sum().backward()
    b[1].sum().backward()
    g1 = plain._feature_blocks.conv1.weight.grad
    g2 = ckpt._feature_blocks.conv1.weight.grad
    assert g1 is not None and g2 is not None and torch.allclose(g1, g2, atol=1e-4)


def test_resnet_standardized_convolutions() -> None:
    trunk = resnet(DEPTH=18, STANDARDIZE_CONVOLUTIONS=True, WIDTH_MULTIPLIER=0.25)
    assert isinstance(trunk._feature_blocks.conv1, StandardizedConv2d)
    assert isinstance(trunk._feature_blocks.layer1[0].conv1, StandardizedConv2d)
    assert set(trunk.state_dict()) == set(resnet(DEPTH=18, WIDTH_MULTIPLIER=0.25).state_dict())
    assert trunk(x(16))[0].shape == (2, 128)


# ------------------------------------------------------------------------------ regnet
@pytest.mark.slow
def test_regnet_cpu_test_params_widths() -> None:
    widths, depths, _ = regnet_stage_params(**CPU_TEST_REGNET)
    assert widths == [24, 56, 152, 368]
    assert depths == [1, 1, 4, 7]
    trunk = regnet(**CPU_TEST_REGNET)
    assert trunk.stage_widths == [24, 56, 152, 368]
    assert trunk(x(32))[0].shape == (2, 368)
    assert trunk(x(16))[0].shape == (2, 368)
    # ClassyVision's default is a RegNetY: squeeze-excitation with se_ratio 0.25
    assert any(isinstance(m, SqueezeExcitation) for m in trunk.modules())
    feats = trunk.eval()(x(32), ["conv1", "res2", "res3", "res4", "res5", "res5avg"])
    assert [f.shape[1] for f in feats] == [32, 24, 56, 152, 368, 368]
    assert feats[0].shape[-1] == 16 and feats[4].shape[-1] == 1


def test_regnet_options_and_named() -> None:
    trunk = regnet(**CPU_TEST_REGNET, use_se=False, stem_width=16)
    assert not any(isinstance(m, SqueezeExcitation) for m in trunk.modules())
    assert trunk._feature_blocks.conv1[0].out_channels == 16
    assert regnet_stage_params(16, 48, 27.89, 2.09, 8)[0] == [48, 104, 208, 440]
    with torch.device("meta"):
        named = regnet(name="regnet_y_400mf")
    assert named.stage_widths == [48, 104, 208, 440]
    assert named.output_dim == 440


def test_regnet_missing_and_unknown_keys() -> None:
    params = dict(CPU_TEST_REGNET)
    del params["w_a"]
    with pytest.raises(ConfigError) as e:
        regnet(**params)
    assert e.value.key_path == "config.MODEL.TRUNK.REGNET.w_a"
    assert "config.MODEL.TRUNK.REGNET.w_a" in str(e.value)
    with pytest.raises(ConfigError) as e:
        regnet()
    assert e.value.key_path == "config.MODEL.TRUNK.REGNET.depth"
    with pytest.raises(ConfigError) as e:
        regnet(**CPU_TEST_REGNET, wdith=3)
    assert e.value.key_path == "config.MODEL.TRUNK.REGNET.wdith"
    with pytest.raises(ConfigError) as e:
        regnet(**{**CPU_TEST_REGNET, "w_0": 20})
    assert e.value.key_path == "config.MODEL.TRUNK.REGNET.w_0"
    with pytest.raises(ConfigError) as e:
        regnet(name="regnet_q_1gf")
    assert "regnet_y_400mf" in str(e.value)


# ------------------------------------------------------------------------------ registry
def test_unknown_trunk_name_error_names_registry_and_lists_names() -> None:
    cfg = model_config()
    cfg.TRUNK.NAME = "resnet50"
    with pytest.raises(UnknownNameError) as e:
        build_model(cfg, AttrDict())
    msg = str(e.value)
    assert "model trunk" in msg and "config.MODEL.TRUNK.NAME" in msg
    assert "'regnet'" in msg and "'resnet'" in msg
    assert "Did you mean 'resnet'" in msg
    assert {"resnet", "regnet"} <= set(MODEL_TRUNKS_REGISTRY.names())


def test_unknown_base_model_name() -> None:
    cfg = model_config()
    cfg.BASE_MODEL_NAME = "multi_input_output"
    with pytest.raises(UnknownNameError) as e:
        build_model(cfg, AttrDict())
    assert "config.MODEL.BASE_MODEL_NAME" in str(e.value)
    assert "multi_input_output_model" in str(e.value)

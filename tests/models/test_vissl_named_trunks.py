"""VISSL's named trunks: efficientnet, convnext, mobilenetv3 (timm / tv), swin_transformer,
xcit, convit, beit, resnet_sk at their smallest sizes: build, forward, feature taps,
state-dict names, config errors, the head / linear-evaluation wiring; ConViT's gated
positional attention against the paper's formula; SyncBN keeping timm's activations."""

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
from vissl.models import build_model
from vissl.models.trunks import get_model_trunk
from vissl.models.trunks.convit import GPSA

pytest.importorskip("timm")

_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]
FEATURES_KEY = "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP"

# the smallest sizes: trunk name -> (MODEL.TRUNK blocks, input size)
TINY: dict[str, tuple[dict[str, Any], int]] = {
    "efficientnet": ({"EFFICIENT_NETS": {"model_version": "B0"}}, 32),
    "convnext": ({"CONVNEXT": {"DEPTH": [1, 1, 1, 1], "DIMS": [8, 16, 24, 32]}}, 32),
    "mobilenetv3": ({"MOBILE_NET": {"NAME": "mobilenetv3_small_050"}}, 32),
    "mobilenetv3_tv": ({"MOBILE_NET": {"NAME": "mobilenetv3_small_100"}}, 32),
    "swin_transformer": (
        {
            "SWIN_TRANSFORMER": {
                "IMAGE_SIZE": 32,
                "EMBED_DIM": 16,
                "DEPTHS": [2, 1],
                "NUM_HEADS": [1, 2],
                "WINDOW_SIZE": 4,
                "DROP_PATH_RATE": 0.0,
            }
        },
        32,
    ),
    "xcit": (
        {
            "XCIT": {
                "IMAGE_SIZE": 32,
                "PATCH_SIZE": 8,
                "HIDDEN_DIM": 16,
                "NUM_LAYERS": 2,
                "NUM_HEADS": 2,
                "DROP_PATH_RATE": 0.0,
            }
        },
        32,
    ),
    "convit": (
        {
            "VISION_TRANSFORMERS": {
                "IMAGE_SIZE": 32,
                "PATCH_SIZE": 8,
                "HIDDEN_DIM": 36,
                "NUM_LAYERS": 3,
                "NUM_HEADS": 9,
                "MLP_DIM": 72,
            },
            "CONVIT": {"N_GPSA_LAYERS": 2, "LOCALITY_DIM": 2},
        },
        32,
    ),
    "beit": (
        {
            "BEIT": {
                "IMAGE_SIZE": 32,
                "PATCH_SIZE": 8,
                "HIDDEN_DIM": 16,
                "NUM_LAYERS": 2,
                "NUM_HEADS": 2,
                "QKV_BIAS": True,
                "USE_REL_POS_BIAS": True,
                "INIT_VALUES": 0.1,
            }
        },
        32,
    ),
    "resnet_sk": ({"RESNETS_SK": {"DEPTH": 50, "WIDTH_MULTIPLIER": 1}}, 32),
}

# trunk name -> (default output width, {tap: shape without the batch}, state-dict names)
EXPECTED: dict[str, tuple[int, dict[str, tuple[int, ...]], list[str]]] = {
    "efficientnet": (
        1280,
        {
            "conv1": (32, 16, 16),
            "block0": (16, 16, 16),
            "block15": (320, 1, 1),
            "conv_final": (1280, 1, 1),
            "avgpool": (1280, 1, 1),
            "flatten": (1280,),
            "dropout": (1280,),
        },
        [
            "timm_model.conv_stem.weight",
            "timm_model.blocks.0.0.conv_dw.weight",
            "timm_model.blocks.1.0.se.conv_reduce.weight",
            "timm_model.blocks.6.0.conv_pwl.weight",
            "timm_model.conv_head.weight",
            "timm_model.bn2.running_var",
        ],
    ),
    "convnext": (
        32,
        {"stage0": (8, 8, 8), "stage3": (32, 1, 1), "pooled": (32,), "lastCLS": (32,)},
        [
            "timm_model.stem.0.weight",
            "timm_model.stages.1.downsample.1.weight",
            "timm_model.stages.3.blocks.0.conv_dw.weight",
            "timm_model.stages.0.blocks.0.gamma",
            "timm_model.stages.0.blocks.0.mlp.fc1.weight",
            "timm_model.head.norm.weight",
        ],
    ),
    "mobilenetv3": (
        288,
        {
            "trunk": (288, 1, 1),
            "trunk_pool": (288,),
            "trunk_pool_norm": (288,),
            "flatten": (288,),
            "stage0": (8, 8, 8),
        },
        ["model.conv_stem.weight", "model.blocks.0.0.conv_dw.weight", "model.bn1.weight"],
    ),
    "mobilenetv3_tv": (
        576,
        {"trunk": (576, 1, 1), "trunk_pool": (576,), "trunk_pool_norm": (576,)},
        [
            "model.features.0.0.weight",
            "model.features.1.block.0.0.weight",
            "model.features.12.1.running_mean",
        ],
    ),
    "swin_transformer": (
        32,
        {"stage0": (16, 8, 8), "stage1": (32, 4, 4), "pooled": (32,), "lastCLS": (32,)},
        [
            "timm_model.patch_embed.proj.weight",
            "timm_model.layers.0.blocks.1.attn.qkv.weight",
            "timm_model.layers.0.blocks.0.attn.relative_position_bias_table",
            "timm_model.layers.1.downsample.reduction.weight",
            "timm_model.norm.weight",
        ],
    ),
    "xcit": (
        16,
        {"lastCLS": (16,), "lastPOOL": (16,), "lastMAP": (16, 4, 4), "blkMAP0": (16, 4, 4)},
        [
            "timm_model.cls_token",
            "timm_model.patch_embed.proj.0.0.weight",
            "timm_model.pos_embed.token_projection.weight",
            "timm_model.blocks.1.attn.temperature",
            "timm_model.blocks.0.local_mp.conv1.weight",
            "timm_model.cls_attn_blocks.1.gamma1",
            "timm_model.norm.weight",
        ],
    ),
    "convit": (
        36,
        {
            "lastCLS": (36,),
            "lastPOOL": (36,),
            "lastMAP": (36, 4, 4),
            "blkMAP0": (36, 4, 4),
            "blkMAP2": (36, 4, 4),
        },
        [
            "patch_embed.proj.weight",
            "class_token",
            "pos_embedding",
            "blocks.0.attn.qk.weight",
            "blocks.0.attn.v.weight",
            "blocks.1.attn.pos_proj.weight",
            "blocks.1.attn.alpha",
            "blocks.2.attn.qkv.weight",
            "blocks.2.mlp.linear_1.weight",
            "norm.weight",
        ],
    ),
    "beit": (
        16,
        {
            "lastPOOL": (16,),
            "lastCLS": (16,),
            "lastMAP": (16, 4, 4),
            "blkCLS0": (16,),
            "concatCLS2": (32,),
        },
        [
            "timm_model.cls_token",
            "timm_model.pos_embed",
            "timm_model.patch_embed.proj.weight",
            "timm_model.blocks.0.attn.q_bias",
            "timm_model.blocks.0.attn.v_bias",
            "timm_model.blocks.1.attn.relative_position_bias_table",
            "timm_model.blocks.1.gamma_1",
            "timm_model.fc_norm.weight",
        ],
    ),
    "resnet_sk": (
        2048,
        {
            "conv1": (64, 8, 8),
            "res2": (256, 8, 8),
            "res5": (2048, 1, 1),
            "res5avg": (2048, 1, 1),
            "flatten": (2048,),
        },
        [
            "net.0.0.weight",
            "net.0.4.weight",
            "net.1.blocks.0.projection.shortcut.2.weight",
            "net.1.blocks.0.projection.bn.0.weight",
            "net.1.blocks.0.net.2.main_conv.0.weight",
            "net.4.blocks.2.net.2.mixing_conv.2.weight",
            "net.4.blocks.2.net.4.0.running_var",
        ],
    ),
}


def model_config(name: str, **trunk: Any) -> AttrDict:
    """config.MODEL with the defaults, TRUNK.NAME ``name`` and its tiny blocks."""
    cfg = copy.deepcopy(_MODEL)
    cfg["TRUNK"]["NAME"] = name
    for blocks in (TINY[name][0], trunk):
        for family, block in copy.deepcopy(blocks).items():
            cfg["TRUNK"][family].update(block)
    return AttrDict(cfg)


def build(name: str, **trunk: Any) -> nn.Module:
    torch.manual_seed(0)
    return get_model_trunk(name)(model_config(name, **trunk), name)


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_trunk_default_output_taps_and_state_dict_names(name: str) -> None:
    trunk = build(name).eval()
    width, taps, keys = EXPECTED[name]
    size = TINY[name][1]
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        (default,) = trunk(x)
        outs = trunk(x, list(taps))
    assert trunk.output_dim == width and default.shape == (2, width)
    assert {n: tuple(o.shape[1:]) for n, o in zip(taps, outs)} == taps
    state = trunk.state_dict()
    missing = [k for k in keys if k not in state]
    assert not missing, f"{missing} not in {list(state)[:8]}..."
    with pytest.raises(ConfigError, match="no feature named 'nope'") as err:
        trunk(x, ["nope"])
    assert err.value.key_path == FEATURES_KEY


def test_timm_built_trunks_match_timms_own_forward() -> None:
    """Our tapped forward passes give what the timm model computes itself."""
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for name, tap in [
            ("efficientnet", "flatten"),
            ("convnext", "pooled"),
            ("swin_transformer", "pooled"),
            ("xcit", "lastCLS"),
            ("beit", "lastPOOL"),
        ]:
            trunk = build(name).eval()
            (ours,) = trunk(x, [tap])
            assert torch.allclose(ours, trunk.timm_model(x), atol=1e-5), name
        mobile = build("mobilenetv3", MOBILE_NET={"TRUNK_ONLY": False}).eval()
        (flat,) = mobile(x)
        assert flat.shape == (2, 1024) and torch.allclose(flat, mobile.model(x), atol=1e-5)


def test_efficientnet_keeps_classyvisions_sizes_and_default_dropout() -> None:
    trunk = build("efficientnet")
    # EfficientNet-B0 without its classifier (5,288,548 - 1280 * 1000 - 1000 parameters)
    assert sum(p.numel() for p in trunk.parameters()) == 4_007_548
    assert trunk.feature_names[-1] == "dropout" and trunk.dropout is not None
    assert trunk.dropout.p == 0.2
    x = torch.randn(2, 3, 32, 32)
    trunk.train()
    torch.manual_seed(1)
    (dropped,) = trunk(x)
    assert (dropped == 0).any()  # training mode: the version's dropout is on the default
    no_se = build("efficientnet", EFFICIENT_NETS={"use_se": False, "model_version": "B0"})
    assert not any("se." in k for k in no_se.state_dict())


def test_resnet_sk_without_selective_kernels_is_a_resnet50() -> None:
    torchvision = pytest.importorskip("torchvision")
    plain = build("resnet_sk", RESNETS_SK={"SK_RATIO": 0.0})
    resnet50 = torchvision.models.resnet50(weights=None)
    expected = sum(p.numel() for n, p in resnet50.named_parameters() if not n.startswith("fc."))
    assert sum(p.numel() for p in plain.parameters()) == expected  # 23,508,032


def test_convit_gpsa_local_init_attends_to_its_kernel_offset() -> None:
    """With the gate open (sigmoid(alpha) ~ 1) a locally initialised GPSA head attends
    with softmax(-s ((dx - a)^2 + (dy - b)^2) + const) around its offset (a, b) of the
    3x3 kernel, computed here from the paper's formula."""
    strength, ld, grid = 2.0, 3, (5, 5)
    gpsa = GPSA(9, 9, False, None, 0.0, 0.0, strength, ld, use_local_init=True)
    gpsa.local_init()
    with torch.no_grad():
        gpsa.alpha.fill_(40.0)
    assert torch.equal(gpsa.v.weight, torch.eye(9))
    coords = [(i % grid[1], i // grid[1]) for i in range(grid[0] * grid[1])]  # (x, y)
    expected = torch.zeros(9, 25, 25)
    for head in range(9):
        a, b = head // 3 - 1, head % 3 - 1  # x and y offsets of the head's kernel cell
        for i, (xi, yi) in enumerate(coords):
            scores = torch.tensor(
                [-strength * ((xj - xi - a) ** 2 + (yj - yi - b) ** 2) for xj, yj in coords]
            )
            expected[head, i] = scores.softmax(0)
    x = torch.randn(1, 25, 9)
    with torch.no_grad():
        attn = gpsa.attention(x, grid)[0]
    assert torch.allclose(attn, expected, atol=1e-5)
    centre = 12  # patch (2, 2): head 5 (a=0, b=1) peaks at (2, 3), patch 17
    assert int(attn[5, centre].argmax()) == 17


def test_convit_takes_other_input_sizes() -> None:
    trunk = build("convit").eval()
    with torch.no_grad():
        cls, grid_map = trunk(torch.randn(2, 3, 16, 24), ["lastCLS", "lastMAP"])
    assert cls.shape == (2, 36) and grid_map.shape == (2, 36, 2, 3)


@pytest.mark.parametrize(
    ("name", "trunk", "key"),
    [
        (
            "efficientnet",
            {"EFFICIENT_NETS": {"model_version": "B9"}},
            "EFFICIENT_NETS.model_version",
        ),
        ("efficientnet", {"EFFICIENT_NETS": {"bn_eps": 0.1}}, "EFFICIENT_NETS.bn_eps"),
        ("convnext", {"CONVNEXT": {"DEPTH": [3, 3, 3]}}, "CONVNEXT.DEPTH"),
        ("convnext", {"CONVNEXT": {"DROP_PATH_RATE": 1.5}}, "CONVNEXT.DROP_PATH_RATE"),
        ("mobilenetv3", {"MOBILE_NET": {"PRETRAINED": True}}, "MOBILE_NET.PRETRAINED"),
        ("mobilenetv3", {"MOBILE_NET": {"NAME": "resnet18"}}, "MOBILE_NET.NAME"),
        ("mobilenetv3_tv", {"MOBILE_NET": {"NAME": "mobilenetv3_large_075"}}, "MOBILE_NET.NAME"),
        (
            "swin_transformer",
            {"SWIN_TRANSFORMER": {"NUM_HEADS": [1]}},
            "SWIN_TRANSFORMER.NUM_HEADS",
        ),
        ("swin_transformer", {"SWIN_TRANSFORMER": {"QK_SCALE": 0.5}}, "SWIN_TRANSFORMER.QK_SCALE"),
        ("xcit", {"XCIT": {"PATCH_SIZE": 4}}, "XCIT.PATCH_SIZE"),
        ("xcit", {"XCIT": {"NUM_HEADS": 3}}, "XCIT.HIDDEN_DIM"),
        ("beit", {"BEIT": {"IMAGE_SIZE": 30}}, "BEIT.IMAGE_SIZE"),
        ("beit", {"BEIT": {"USE_MEAN_POOLING": "yes"}}, "BEIT.USE_MEAN_POOLING"),
        ("convit", {"CONVIT": {"N_GPSA_LAYERS": 4}}, "CONVIT.N_GPSA_LAYERS"),
        (
            "convit",
            {"CONVIT": {"CLASS_TOKEN_IN_LOCAL_LAYERS": True}},
            "CONVIT.CLASS_TOKEN_IN_LOCAL_LAYERS",
        ),
        ("resnet_sk", {"RESNETS_SK": {"DEPTH": 34}}, "RESNETS_SK.DEPTH"),
        ("resnet_sk", {"RESNETS_SK": {"WIDTH_MULTIPLIER": 1.5}}, "RESNETS_SK.WIDTH_MULTIPLIER"),
    ],
)
def test_bad_values_raise_config_errors_naming_the_key(
    name: str, trunk: dict[str, Any], key: str
) -> None:
    cfg = model_config(name)
    for family, block in trunk.items():
        cfg.TRUNK[family] = {**cfg.TRUNK[family], **block}
    with pytest.raises(ConfigError) as err:
        get_model_trunk(name)(AttrDict(cfg), name)
    assert err.value.key_path == f"config.MODEL.TRUNK.{key}"
    assert f"config.MODEL.TRUNK.{key}" in str(err.value)


def test_heads_and_linear_evaluation_taps_wire_up() -> None:
    """A pretraining head on the default output, and a frozen trunk with one eval_mlp
    head per tapped layer (as VISSL's linear-evaluation configs)."""
    cfg = model_config("convnext")
    cfg.HEAD.PARAMS = [["mlp", {"dims": [32, 16]}]]
    model = build_model(cfg, AttrDict())
    (out,) = model(torch.randn(4, 3, 32, 32))
    assert out.shape == (4, 16)

    cfg = model_config("swin_transformer")
    fe = cfg.FEATURE_EVAL_SETTINGS
    fe.EVAL_MODE_ON, fe.FREEZE_TRUNK_ONLY, fe.SHOULD_FLATTEN_FEATS = True, True, False
    fe.LINEAR_EVAL_FEAT_POOL_OPS_MAP = [
        ["stage0", ["AdaptiveAvgPool2d", [[2, 2]]]],
        ["lastCLS", ["Identity", []]],
    ]
    cfg.HEAD.PARAMS = [
        ["eval_mlp", {"in_channels": 16, "dims": [64, 10]}],
        ["eval_mlp", {"in_channels": 32, "dims": [32, 10]}],
    ]
    model = build_model(cfg, AttrDict())
    outs = model(torch.randn(4, 3, 32, 32))
    assert [tuple(o.shape) for o in outs] == [(4, 10), (4, 10)]
    assert not any(p.requires_grad for p in model.trunk.parameters())


def test_cpu_sync_batchnorm_keeps_timms_norm_act_activation() -> None:
    from timm.layers import BatchNormAct2d

    from vissl.utils.sync_bn import CpuSyncBatchNormAct, _convert

    layer = nn.Sequential(BatchNormAct2d(4, act_layer=nn.SiLU))
    x = torch.randn(3, 4, 5, 5)
    expected = layer(x)
    converted = _convert(copy.deepcopy(layer), None)
    assert isinstance(converted[0], CpuSyncBatchNormAct)
    assert list(converted.state_dict()) == list(layer.state_dict())
    assert torch.allclose(converted(x), expected, atol=1e-6)
    assert (expected < 0).any() and expected.min() > -0.3  # SiLU's output, not BatchNorm's


def test_timm_built_trunks_use_the_timm_trunks_prefix() -> None:
    """The trunks built on timm keep their model under timm_model., the timm trunk's
    prefix, so timm state dicts map onto them (vissl/utils/external_weights.py)."""
    from vissl.utils.external_weights import TIMM_TRUNK_PREFIX, trunk_layout

    for name in ("efficientnet", "convnext", "swin_transformer", "xcit", "beit"):
        keys = [f"trunk.{k}" for k in build(name).state_dict()]
        assert all(k.startswith("trunk." + TIMM_TRUNK_PREFIX) for k in keys), name
        assert trunk_layout(keys) == ("timm", "trunk." + TIMM_TRUNK_PREFIX)


# the trunk families that declare typed Params: family -> (params class path, a trunk name)
_PARAMS = {
    "MOBILE_NET": ("vissl.models.trunks.mobile_net:MobileNetParams", "mobilenetv3"),
    "SWIN_TRANSFORMER": ("vissl.models.trunks.swin_transformer:SwinParams", "swin_transformer"),
    "XCIT": ("vissl.models.trunks.xcit:XCiTParams", "xcit"),
    "BEIT": ("vissl.models.trunks.beit:BEiTParams", "beit"),
    "CONVIT": ("vissl.models.trunks.convit:ConViTParams", "convit"),
    "CONVNEXT": ("vissl.models.trunks.convnext:ConvNeXtParams", "convnext"),
    "EFFICIENT_NETS": ("vissl.models.trunks.efficientnet:EfficientNetParams", "efficientnet"),
    "RESNETS_SK": ("vissl.models.trunks.resnet_sk:ResNetSKParams", "resnet_sk"),
}


def _params_cls(family: str) -> type:
    import importlib

    module, _, name = _PARAMS[family][0].partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


@pytest.mark.parametrize("family", sorted(_PARAMS))
def test_params_defaults_are_the_defaults_yaml_block(family: str) -> None:
    from vissl.config.params import as_dict

    assert as_dict(_params_cls(family)()) == _MODEL["TRUNK"][family]


@pytest.mark.parametrize("family", sorted(_PARAMS))
def test_unknown_trunk_key_names_its_path_and_the_valid_keys(family: str) -> None:
    from vissl.config.params import keys_of
    from vissl.errors import UnknownKeyError

    name = _PARAMS[family][1]
    cfg = model_config(name)
    cfg.TRUNK[family] = {**cfg.TRUNK[family], "NOT_A_KEY": 1}
    with pytest.raises(UnknownKeyError) as err:
        get_model_trunk(name)(AttrDict(cfg), name)
    assert err.value.key_path == f"config.MODEL.TRUNK.{family}.NOT_A_KEY"
    assert str(keys_of(_params_cls(family))) in str(err.value)


@pytest.mark.parametrize(
    ("family", "block", "expected"),
    [
        ("BEIT", {"INIT_VALUES": False}, False),
        ("BEIT", {"INIT_VALUES": None}, None),
        ("BEIT", {"INIT_VALUES": 0}, 0.0),
        ("BEIT", {"INIT_VALUES": 0.1}, 0.1),
        ("CONVIT", {"QK_SCALE": 0.5}, 0.5),
        ("CONVIT", {"QK_SCALE": None}, None),
        ("CONVIT", {"N_GPSA_LAYERS": 0}, 0),
        ("SWIN_TRANSFORMER", {"MLP_RATIO": 2}, 2.0),
        ("XCIT", {"ETA": 1}, 1.0),
    ],
)
def test_params_accept_vissls_values(family: str, block: dict[str, Any], expected: Any) -> None:
    from vissl.config.params import parse

    p = parse(_params_cls(family), block, f"config.MODEL.TRUNK.{family}")
    assert getattr(p, next(iter(block))) == expected


@pytest.mark.parametrize(
    ("family", "block", "key"),
    [
        ("BEIT", {"INIT_VALUES": True}, "INIT_VALUES"),
        ("BEIT", {"INIT_VALUES": -1}, "INIT_VALUES"),
        ("SWIN_TRANSFORMER", {"DEPTHS": []}, "DEPTHS"),
        ("SWIN_TRANSFORMER", {"DEPTHS": [2, 0]}, "DEPTHS[1]"),
        ("SWIN_TRANSFORMER", {"EMBED_DIM": 10}, "NUM_HEADS"),
        ("SWIN_TRANSFORMER", {"name": 3}, "name"),
        ("XCIT", {"QK_SCALE": 0.5}, "QK_SCALE"),
        ("XCIT", {"ETA": 0}, "ETA"),
        ("CONVIT", {"N_GPSA_LAYERS": -1}, "N_GPSA_LAYERS"),
        ("CONVIT", {"LOCALITY_DIM": 0}, "LOCALITY_DIM"),
        ("MOBILE_NET", {"TIMM_BN": "yes"}, "TIMM_BN"),
    ],
)
def test_params_refuse_bad_values_naming_the_key(
    family: str, block: dict[str, Any], key: str
) -> None:
    from vissl.config.params import parse

    with pytest.raises(ConfigError) as err:
        parse(_params_cls(family), block, f"config.MODEL.TRUNK.{family}")
    assert err.value.key_path == f"config.MODEL.TRUNK.{family}.{key}"

"""VISSL's AlexNet trunks: the shape of every tap at each variant's input size (worked out
by hand below), VISSL's state-dict names, VISSL's linear-evaluation taps and eval_mlp
widths, building from a composed config, and the typed errors (key paths)."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import BaseSSLMultiInputOutputModel, build_model
from vissl.models.trunks import MODEL_TRUNKS_REGISTRY, get_model_trunk
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.weights_init import init_model_from_checkpoint

_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL_DEFAULTS: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]

NAMES = [
    "alexnet_bvlc",
    "alexnet_jigsaw",
    "alexnet_colorization",
    "alexnet_deepcluster",
    "alexnet_rotnet",
]
TAPS = ["conv1", "pool1", "conv2", "pool2", "conv3", "conv4", "conv5", "pool5", "flatten"]

# Output side = (side + 2 * pad - kernel) // stride + 1, per conv / 3x3-stride-2 pool.
# bvlc, colorization at 227: conv1 k11 s4 -> 55, pool -> 27, conv2 (pad 2) 27, pool 13,
# conv3-5 (pad 1) 13, pool5 6.
_BVLC = [(96, 55), (96, 27), (256, 27), (256, 13), (384, 13), (384, 13), (256, 13), (256, 6)]
# jigsaw at 227: conv1 k11 s2 -> 109, pool 54, conv2 54, pool 26, conv3-5 26, pool5 12.
_JIGSAW = [(96, 109), (96, 54), (256, 54), (256, 26), (384, 26), (384, 26), (256, 26), (256, 12)]
# deepcluster at 224: Sobel keeps 224; conv1 k11 s4 pad 2 -> 55, then as bvlc.
_DEEPCLUSTER = _BVLC
# rotnet at 224: conv1 k11 s4 pad 2 -> 55 (64 ch), conv2 192, conv3 384, conv4 256, conv5 256.
_ROTNET = [(64, 55), (64, 27), (192, 27), (192, 13), (384, 13), (256, 13), (256, 13), (256, 6)]

# name -> (input side, input type, [(channels, side) of conv1..pool5])
EXPECTED: dict[str, tuple[int, str, list[tuple[int, int]]]] = {
    "alexnet_bvlc": (227, "rgb", _BVLC),
    "alexnet_jigsaw": (227, "rgb", _JIGSAW),
    "alexnet_colorization": (227, "lab", _BVLC),
    "alexnet_deepcluster": (224, "rgb", _DEEPCLUSTER),
    "alexnet_rotnet": (224, "rgb", _ROTNET),
}

# VISSL's linear-evaluation taps of each trunk (benchmark/linear_image_classification/
# imagenet1k/models/alexnet_*.yaml) and the eval_mlp input widths they give.
_AVG = [
    ["conv1", ["AvgPool2d", [[19, 19], 4, 0]]],
    ["conv2", ["AvgPool2d", [[12, 12], 3, 0]]],
    ["conv3", ["AvgPool2d", [[9, 9], 1, 0]]],
    ["conv4", ["AvgPool2d", [[9, 9], 1, 0]]],
    ["conv5", ["AvgPool2d", [[8, 8], 1, 0]]],
]
_AVG_WIDTHS = [(96, 9600), (256, 9216), (384, 9600), (384, 9600), (256, 9216)]
LINEAR_EVAL: dict[str, tuple[list[Any], list[tuple[int, int]]]] = {
    "alexnet_bvlc": (_AVG, _AVG_WIDTHS),
    "alexnet_colorization": (_AVG, _AVG_WIDTHS),
    "alexnet_deepcluster": (_AVG, _AVG_WIDTHS),
    "alexnet_jigsaw": (
        [
            ["conv1", ["AvgPool2d", [[28, 28], 9, 0]]],
            ["conv2", ["AvgPool2d", [[24, 24], 6, 0]]],
            ["conv3", ["AvgPool2d", [[14, 14], 3, 0]]],
            ["conv4", ["AvgPool2d", [[14, 14], 3, 0]]],
            ["conv5", ["AvgPool2d", [[16, 16], 2, 0]]],
        ],
        _AVG_WIDTHS,
    ),
    "alexnet_rotnet": (
        [
            ["conv1", ["AdaptiveMaxPool2d", [12]]],
            ["conv2", ["AdaptiveMaxPool2d", [7]]],
            ["conv3", ["AdaptiveMaxPool2d", [5]]],
            ["conv4", ["AdaptiveMaxPool2d", [6]]],
            ["conv5", ["AdaptiveMaxPool2d", [6]]],
        ],
        [(64, 9216), (192, 9408), (384, 9600), (256, 9216), (256, 9216)],
    ),
}


def model_config(name: str, **alexnet: Any) -> AttrDict:
    cfg = AttrDict(copy.deepcopy(_MODEL_DEFAULTS))
    cfg.TRUNK.NAME = name
    cfg.INPUT_TYPE = EXPECTED[name][1]
    cfg.TRUNK.ALEXNET.update(alexnet)
    return cfg


def trunk(name: str, **alexnet: Any) -> Any:
    return get_model_trunk(name)(model_config(name, **alexnet), name)


def batch(name: str, n: int = 2, size: int | None = None) -> torch.Tensor:
    side = size or EXPECTED[name][0]
    return torch.randn(n, 3, side, side, generator=torch.Generator().manual_seed(0))


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_all_five_are_registered() -> None:
    assert set(NAMES) <= set(MODEL_TRUNKS_REGISTRY.names())


@pytest.mark.parametrize("name", NAMES)
def test_every_tap_has_the_worked_out_shape_and_flatten_is_the_default(name: str) -> None:
    side, _, maps = EXPECTED[name]
    t = trunk(name).eval()
    x = batch(name)
    with torch.no_grad():
        feats = t(x, TAPS)
        (default,) = t(x)
    expected = [(2, c, s, s) for c, s in maps] + [(2, maps[-1][0] * maps[-1][1] ** 2)]
    assert [tuple(f.shape) for f in feats] == expected
    assert torch.equal(default, feats[-1])
    assert torch.equal(feats[-1], feats[-2].flatten(1))
    assert t.feature_names == TAPS
    assert t.input_size == side
    # a tap asked alone equals the same tap asked with others (and in any order)
    with torch.no_grad():
        conv3, conv1 = t(x, ["conv3", "conv1"])
    assert torch.equal(conv3, feats[4]) and torch.equal(conv1, feats[0])


# VISSL's parameter names: block i of _feature_blocks, conv ".0", BatchNorm ".1" (what
# extra_scripts/convert_caffe2_to_vissl_alexnet.py writes: conv1..conv5 -> 0, 2, 4, 5, 6).
_CONV = ["weight", "bias"]
_BN = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]


def _vissl_keys(bn_blocks: list[int]) -> set[str]:
    keys = set()
    for block in (0, 2, 4, 5, 6):
        keys |= {f"_feature_blocks.{block}.0.{k}" for k in _CONV}
        if block in bn_blocks:
            keys |= {f"_feature_blocks.{block}.1.{k}" for k in _BN}
    return keys


@pytest.mark.parametrize(
    ("name", "bn_blocks"),
    [
        ("alexnet_bvlc", []),
        ("alexnet_jigsaw", [4, 5, 6]),
        ("alexnet_colorization", [0, 2, 4, 5, 6]),
        ("alexnet_deepcluster", [0, 2, 4, 5, 6]),
        ("alexnet_rotnet", [0, 2, 4, 5, 6]),
    ],
)
def test_state_dict_names_are_vissls(name: str, bn_blocks: list[int]) -> None:
    assert set(trunk(name).state_dict()) == _vissl_keys(bn_blocks)


def test_grouped_convolutions_as_in_the_two_gpu_alexnet() -> None:
    groups = {
        name: [trunk(name)._feature_blocks[i][0].groups for i in (0, 2, 4, 5, 6)] for name in NAMES
    }
    assert groups["alexnet_bvlc"] == [1, 2, 1, 2, 2]
    assert groups["alexnet_jigsaw"] == [1, 2, 1, 2, 2]
    assert groups["alexnet_colorization"] == [1, 2, 1, 2, 2]
    assert groups["alexnet_deepcluster"] == [1, 1, 1, 1, 1]
    assert groups["alexnet_rotnet"] == [1, 1, 1, 1, 1]


def test_colorization_sees_only_the_l_channel() -> None:
    t = trunk("alexnet_colorization").eval()
    x = batch("alexnet_colorization", size=67)
    y = x.clone()
    y[:, 1:] = torch.randn_like(y[:, 1:])  # other a, b
    with torch.no_grad():
        assert torch.equal(t(x, ["conv5"])[0], t(y, ["conv5"])[0])
        assert t._feature_blocks[0][0].in_channels == 1


def test_deepcluster_sobel_is_a_fixed_gradient_of_the_gray_image() -> None:
    t = trunk("alexnet_deepcluster")
    # a horizontal ramp: gray(x, y) = x in every channel
    ramp = torch.arange(8.0).repeat(8, 1).expand(1, 3, 8, 8)
    grad = t.sobel(ramp)
    # Sobel x kernel [[1,0,-1],[2,0,-2],[1,0,-1]] on a unit ramp: (1+2+1) * (x-1 - (x+1)) = -8
    assert torch.allclose(grad[0, 0, 1:-1, 1:-1], torch.full((6, 6), -8.0), atol=1e-5)
    assert torch.allclose(grad[0, 1, 1:-1, 1:-1], torch.zeros(6, 6), atol=1e-5)
    # written out: mean of channels, then the two kernels with zero padding
    x = batch("alexnet_deepcluster", n=1, size=9)
    gray = x.mean(dim=1, keepdim=True)
    kx = torch.tensor([[1.0, 0, -1], [2, 0, -2], [1, 0, -1]])
    expected = torch.cat(
        [
            F.conv2d(gray, kx.view(1, 1, 3, 3), padding=1),
            F.conv2d(gray, kx.t().view(1, 1, 3, 3), padding=1),
        ],
        dim=1,
    )
    assert torch.allclose(t.sobel(x), expected, atol=1e-5)
    # constants: not parameters, not in the state dict
    assert not any("sobel" in k for k in t.state_dict())
    assert not any("sobel" in n for n, _ in t.named_parameters())


@pytest.mark.parametrize("name", NAMES)
def test_vissl_linear_eval_taps_give_the_eval_mlp_widths(name: str) -> None:
    pool_map, widths = LINEAR_EVAL[name]
    cfg = model_config(name)
    cfg.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON = True
    cfg.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY = True
    cfg.FEATURE_EVAL_SETTINGS.SHOULD_FLATTEN_FEATS = False
    cfg.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP = pool_map
    cfg.HEAD.PARAMS = [["eval_mlp", {"in_channels": c, "dims": [w, 10]}] for c, w in widths]
    model = build_model(cfg, AttrDict()).eval()
    with torch.no_grad():
        feats = model.get_features(batch(name))
        outs = model(batch(name))
    assert [f[0].numel() for f in feats] == [w for _, w in widths]
    assert [f.shape[1] for f in feats] == [c for c, _ in widths]
    assert [tuple(o.shape) for o in outs] == [(2, 10)] * 5


def test_vissl_converted_checkpoint_loads_with_vissls_weights_init_keys() -> None:
    # a converted file as VISSL's model zoo has them: {"model_state_dict": {_feature_blocks...}}
    source = trunk("alexnet_colorization")
    state = {k: torch.randn_like(v.float()).to(v.dtype) for k, v in source.state_dict().items()}
    cfg = model_config("alexnet_colorization")
    cfg.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON = True
    cfg.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_ONLY = True
    cfg.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP = _AVG
    cfg.HEAD.PARAMS = [["eval_mlp", {"in_channels": c, "dims": [w, 10]}] for c, w in _AVG_WIDTHS]
    model = build_model(cfg, AttrDict())
    weights = {
        "STATE_DICT_KEY_NAME": "model_state_dict",
        "APPEND_PREFIX": "trunk.base_model.",
        "SKIP_LAYERS": ["num_batches_tracked"],
    }
    report = init_model_from_checkpoint(model, {"model_state_dict": state}, weights, cfg)
    assert len(report.loaded) == len([k for k in state if "num_batches_tracked" not in k])
    loaded = model.trunk.base_model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in state.items() if "num_batches" not in k)


def test_default_output_conv5_feeds_the_heads_the_map() -> None:
    cfg = model_config("alexnet_colorization", DEFAULT_OUTPUT="conv5")
    model = build_model(cfg, AttrDict())
    assert isinstance(model, BaseSSLMultiInputOutputModel)
    (out,) = model(batch("alexnet_colorization", size=99))
    assert tuple(out.shape) == (2, 256, 5, 5)  # 99 -> conv1 23 -> pool 11 -> pool 5


# ------------------------------------------------------------------------- configs
def _compose(*overrides: str) -> AttrDict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, cfg = hydra_compose_and_validate(["config=quick_start", *overrides])
    return cfg


@pytest.mark.parametrize("name", NAMES)
def test_every_trunk_builds_from_a_composed_config(name: str) -> None:
    _, input_type, maps = EXPECTED[name]
    width = maps[-1][0] * maps[-1][1] ** 2
    cfg = _compose(
        f"config.MODEL.TRUNK.NAME={name}",
        f"config.MODEL.INPUT_TYPE={input_type}",
        f"config.MODEL.HEAD.PARAMS=[[mlp,{{dims:[{width},16]}}]]",
    )
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    with torch.no_grad():
        (out,) = model.eval()(batch(name))
    assert tuple(out.shape) == (2, 16)


def test_unknown_alexnet_key_in_a_config_names_its_path() -> None:
    with pytest.raises(ConfigError) as err:
        _compose(
            "config.MODEL.TRUNK.NAME=alexnet_bvlc",
            "+config.MODEL.TRUNK.ALEXNET.DEFAULT_OUTPT=conv5",
        )
    assert err.value.key_path == "config.MODEL.TRUNK.ALEXNET.DEFAULT_OUTPT"
    # the trunk checks its own keys too (a config built in Python)
    with pytest.raises(ConfigError) as err:
        trunk("alexnet_rotnet", DEFAULT_OUTPT="conv5")
    assert err.value.key_path == "config.MODEL.TRUNK.ALEXNET.DEFAULT_OUTPT"
    assert "DEFAULT_OUTPUT" in str(err.value)


def test_bad_values_raise_config_errors_with_key_paths() -> None:
    with pytest.raises(ConfigError) as err:
        trunk("alexnet_bvlc", DEFAULT_OUTPUT="res5")
    assert err.value.key_path == "config.MODEL.TRUNK.ALEXNET.DEFAULT_OUTPUT"
    assert "'conv5'" in str(err.value)
    cfg = model_config("alexnet_colorization")
    cfg.INPUT_TYPE = "rgb"
    with pytest.raises(ConfigError) as err:
        get_model_trunk("alexnet_colorization")(cfg, "alexnet_colorization")
    assert err.value.key_path == "config.MODEL.INPUT_TYPE" and "'lab'" in str(err.value)
    cfg = model_config("alexnet_jigsaw")
    cfg.INPUT_TYPE = "lab"
    with pytest.raises(ConfigError) as err:
        get_model_trunk("alexnet_jigsaw")(cfg, "alexnet_jigsaw")
    assert err.value.key_path == "config.MODEL.INPUT_TYPE"
    with pytest.raises(ConfigError) as err:
        trunk("alexnet_bvlc")(batch("alexnet_bvlc", size=67), ["res5"])
    assert err.value.key_path == "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP"


def test_too_small_input_says_the_smallest_size() -> None:
    t = trunk("alexnet_bvlc")
    assert t.min_input_size() == 67  # 67 -> 15 -> 7 -> 7 -> 3 -> pool5 1
    t(batch("alexnet_bvlc", size=67))
    with pytest.raises(ValueError, match="at least 67 px"):
        t(batch("alexnet_bvlc", size=66))
    # a shallower tap needs less
    (conv1,) = t(batch("alexnet_bvlc", size=20), ["conv1"])
    assert tuple(conv1.shape) == (2, 96, 3, 3)


def test_bgr_input_flips_the_channels() -> None:
    rgb = trunk("alexnet_rotnet").eval()
    cfg = model_config("alexnet_rotnet")
    cfg.INPUT_TYPE = "bgr"
    bgr = get_model_trunk("alexnet_rotnet")(cfg, "alexnet_rotnet").eval()
    bgr.load_state_dict(rgb.state_dict())
    x = batch("alexnet_rotnet", size=63)
    with torch.no_grad():
        assert torch.allclose(bgr(x)[0], rgb(x.flip(1))[0])

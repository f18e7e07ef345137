"""The ``timm`` trunk: any timm model, pretrained=False, with vissl's feature taps."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import timm
import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import build_model
from vissl.models.trunks import get_model_trunk
from vissl.models.trunks.timm_trunk import TimmTrunk


def trunk(name: str = "resnet18", **kwargs: Any) -> TimmTrunk:
    cfg = {"TRUNK": {"NAME": "timm", "TIMM": {"MODEL_NAME": name, "KWARGS": kwargs}}}
    return get_model_trunk("timm")(cfg, "timm").eval()


def test_default_output_is_timms_pooled_feature_and_taps_are_stages() -> None:
    t = trunk("resnet18")
    assert isinstance(t, TimmTrunk) and t.output_dim == 512
    assert t.stage_modules == {
        "stage0": "act1",
        "stage1": "layer1",
        "stage2": "layer2",
        "stage3": "layer3",
        "stage4": "layer4",
    }
    assert next(iter(t.state_dict())).startswith("timm_model.")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        (pooled,) = t(x)
        assert torch.equal(pooled, t.timm_model(x))
        s1, p, f, s4 = t(x, ["stage1", "pooled", "features", "stage4"])
        assert s1.shape == (2, 64, 8, 8) and s4.shape == (2, 512, 1, 1)
        assert torch.equal(p, pooled) and torch.equal(f, t.timm_model.forward_features(x))
        (only,) = t(x, ["stage2"])  # intermediates only: stops early
        assert only.shape == (2, 128, 4, 4)


def test_vit_with_small_images_taps_blocks_as_maps() -> None:
    t = trunk("vit_tiny_patch16_224", img_size=8, patch_size=4, depth=2)
    assert t.output_dim == 192 and list(t.stage_modules.values()) == ["blocks.0", "blocks.1"]
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        pooled, block0, tokens = t(x, ["pooled", "stage0", "features"])
        assert torch.allclose(pooled, t.timm_model(x))
    assert block0.shape == (2, 192, 2, 2) and tokens.shape == (2, 5, 192)


def test_in_chans_follows_input_type_and_num_classes_sets_output_dim() -> None:
    cfg = {"INPUT_TYPE": "lab", "TRUNK": {"TIMM": {"MODEL_NAME": "resnet18"}}}
    t = TimmTrunk(cfg)
    assert t.timm_model.conv1.in_channels == 1
    assert t(torch.randn(2, 3, 16, 16))[0].shape == (2, 512)
    assert trunk("resnet18", num_classes=7)(torch.randn(2, 3, 16, 16))[0].shape == (2, 7)
    assert trunk("resnet18", num_classes=7).output_dim == 7


def test_user_errors_name_the_config_key(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"'resnet_18' is not a timm .*'resnet18'") as err:
        trunk("resnet_18")
    assert err.value.key_path == "config.MODEL.TRUNK.TIMM.MODEL_NAME"
    with pytest.raises(ConfigError, match="must name a timm model") as err:
        trunk("")
    assert err.value.key_path == "config.MODEL.TRUNK.TIMM.MODEL_NAME"
    with pytest.raises(ConfigError, match="pretrained=False") as err:
        trunk("resnet18", pretrained=True)
    assert err.value.key_path == "config.MODEL.TRUNK.TIMM.KWARGS"
    with pytest.raises(ConfigError, match="unexpected keyword argument 'bogus'") as err:
        trunk("resnet18", bogus=1)
    assert err.value.key_path == "config.MODEL.TRUNK.TIMM.KWARGS"
    with pytest.raises(ConfigError, match=r"no feature named 'res5'.*'stage4'"):
        trunk()(torch.randn(1, 3, 8, 8), ["res5"])
    monkeypatch.setitem(sys.modules, "timm", None)  # as if timm were not installed
    with pytest.raises(ConfigError, match="pip install timm") as err:
        trunk()
    assert err.value.key_path == "config.MODEL.TRUNK.TIMM.MODEL_NAME"


def model_config(**fe: Any) -> AttrDict:
    return AttrDict(
        {
            "TRUNK": {"NAME": "timm", "TIMM": {"MODEL_NAME": "resnet18", "KWARGS": {}}},
            "HEAD": {"PARAMS": [["mlp", {"dims": [512, 10]}]]},
            "FEATURE_EVAL_SETTINGS": fe,
        }
    )


def test_heads_and_linear_evaluation_taps() -> None:
    model = build_model(model_config(), AttrDict({})).eval()
    assert model(torch.randn(2, 3, 8, 8))[0].shape == (2, 10)
    fe = {
        "EVAL_MODE_ON": True,
        "FREEZE_TRUNK_ONLY": True,
        "LINEAR_EVAL_FEAT_POOL_OPS_MAP": [
            ["stage3", ["AdaptiveAvgPool2d", [[1, 1]]]],
            ["pooled", ["Identity", []]],
        ],
    }
    cfg = model_config(**fe)
    cfg.HEAD.PARAMS = [
        [["eval_mlp", {"in_channels": 256, "dims": [256, 10]}]],
        [["eval_mlp", {"in_channels": 512, "dims": [512, 10]}]],
    ]
    model = build_model(cfg, AttrDict({})).eval()
    feats = model.trunk(torch.randn(2, 3, 8, 8), ["stage3", "pooled"])  # pooled by the map
    assert [f.shape for f in feats] == [(2, 256), (2, 512)]
    assert [o.shape for o in model(torch.randn(2, 3, 8, 8))] == [(2, 10), (2, 10)]


def test_timm_is_the_installed_library() -> None:
    assert timm.is_model("resnet18")

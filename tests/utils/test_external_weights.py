"""MODEL.WEIGHTS_INIT of torchvision / timm state dicts and .safetensors files, no key settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import timm
import torch
import torchvision
from safetensors.torch import save_file
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import build_model
from vissl.utils.external_weights import map_external_state_dict, trunk_layout
from vissl.utils.weights_init import init_model_from_weights_params_file


def resnet_model(depth: int = 18) -> nn.Module:
    cfg = AttrDict(
        {
            "TRUNK": {"NAME": "resnet", "RESNETS": {"DEPTH": depth}},
            "HEAD": {"PARAMS": [["mlp", {"dims": [512, 8]}]]},
        }
    )
    return build_model(cfg, AttrDict({}))


def timm_model(name: str = "resnet18", **kwargs: Any) -> nn.Module:
    cfg = AttrDict(
        {
            "TRUNK": {"NAME": "timm", "TIMM": {"MODEL_NAME": name, "KWARGS": kwargs}},
            "HEAD": {"PARAMS": [["mlp", {"dims": [512, 8]}]]},
        }
    )
    return build_model(cfg, AttrDict({}))


def features(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval().trunk(x)[0]


def test_torchvision_resnet18_file_loads_into_the_resnet_trunk(tmp_path: Path) -> None:
    tv = torchvision.models.resnet18()  # with its fc: a classifier the trunk has not
    path = tmp_path / "resnet18.pth"
    torch.save({f"module.{k}": v for k, v in tv.state_dict().items()}, path)  # DDP names
    model = resnet_model()
    heads_before = model.heads.state_dict()["0.clf.0.weight"].clone()
    report = init_model_from_weights_params_file(model, {"PARAMS_FILE": str(path)})
    assert "fc.weight" not in report.loaded and len(report.loaded) > 100
    tv.fc = nn.Identity()  # type: ignore[assignment]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(features(model, x), tv.eval()(x), atol=1e-5)
    assert torch.equal(model.heads.state_dict()["0.clf.0.weight"], heads_before)


def test_timm_vit_safetensors_file_loads_into_the_timm_trunk(tmp_path: Path) -> None:
    kwargs = {"img_size": 8, "patch_size": 4, "depth": 1}
    source = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3, **kwargs)
    path = tmp_path / "vit.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    model = timm_model("vit_tiny_patch16_224", **kwargs)
    init_model_from_weights_params_file(model, {"PARAMS_FILE": str(path)})  # head.* left out
    source.reset_classifier(0)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.allclose(features(model, x), source.eval()(x), atol=1e-5)


def test_mismatch_lists_missing_unexpected_and_shapes(tmp_path: Path) -> None:
    path = tmp_path / "resnet34.pth"
    torch.save(torchvision.models.resnet34().state_dict(), path)
    with pytest.raises(ConfigError) as err:
        init_model_from_weights_params_file(resnet_model(18), {"PARAMS_FILE": str(path)})
    text = str(err.value)
    assert "torchvision/timm ResNet state dict for the 'resnet' trunk" in text
    assert "unexpected in the file" in text and "layer1.2." in text
    assert err.value.key_path == "config.MODEL.WEIGHTS_INIT.PARAMS_FILE"

    path = tmp_path / "resnet10t.pth"
    torch.save(timm.create_model("resnet10t", num_classes=0).state_dict(), path)
    with pytest.raises(ConfigError, match=r"(?s)missing in the file.*conv1.weight"):
        init_model_from_weights_params_file(timm_model("resnet18"), {"PARAMS_FILE": str(path)})


def test_layout_detection_and_files_it_leaves_alone() -> None:
    assert trunk_layout(list(resnet_model().state_dict())) == ("resnet", "trunk._feature_blocks.")
    assert trunk_layout(["trunk.base_model.timm_model.x"]) == (
        "timm",
        "trunk.base_model.timm_model.",
    )
    assert trunk_layout(["trunk.blocks.0.norm1.weight"]) is None
    target = resnet_model().state_dict()
    # not a ResNet state dict, or already vissl names: the generic WEIGHTS_INIT rules apply
    assert map_external_state_dict({"weight": torch.zeros(1)}, target) is None
    assert (
        map_external_state_dict({"trunk._feature_blocks.conv1.weight": torch.zeros(1)}, target)
        is None
    )


def test_bad_safetensors_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.safetensors"
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match="not a readable safetensors file") as err:
        init_model_from_weights_params_file(resnet_model(), {"PARAMS_FILE": str(path)})
    assert err.value.key_path == "config.MODEL.WEIGHTS_INIT.PARAMS_FILE"

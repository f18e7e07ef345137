"""extra_scripts/convert_vissl_to_detectron2.py: a .pkl detectron2 reads, without detectron2.

detectron2 is not installed, so its side is written out here: the names of its ResNet
backbone (``stem.conv1`` with ``.norm``, ``res{2..5}.{i}.conv{k}`` with ``.norm``,
``shortcut`` on a stage's first block where the width or the stride changes) and how its ``DetectionCheckpointer`` reads a
``.pkl`` file (``pickle.load(f, encoding="latin1")``, a dict with ``model`` and
``__author__``, numpy arrays under ``matching_heuristics``).
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision
import yaml
from omegaconf import OmegaConf

import vissl
from tests._reference_models import randomize
from tests.extra_scripts._helpers import assert_one_line_error, import_script, run_as_main
from vissl.config.attr_dict import AttrDict
from vissl.models import build_model

d2 = import_script("convert_vissl_to_detectron2")
torch.set_num_threads(1)
_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]
NORM = ("weight", "bias", "running_mean", "running_var")


def detectron2_resnet_names(layers: tuple[int, ...], bottleneck: bool) -> set[str]:
    """detectron2's ResNet backbone names (its BasicStem, BottleneckBlock / BasicBlock)."""
    names = {"stem.conv1.weight"} | {f"stem.conv1.norm.{p}" for p in NORM}
    convs = (1, 2, 3) if bottleneck else (1, 2)
    for stage, depth in enumerate(layers, start=2):
        for i in range(depth):
            pre = f"res{stage}.{i}."
            for k in convs:
                names |= {pre + f"conv{k}.weight"} | {pre + f"conv{k}.norm.{p}" for p in NORM}
            if i == 0 and (bottleneck or stage > 2):  # where the width or stride changes
                names |= {pre + "shortcut.weight"} | {pre + f"shortcut.norm.{p}" for p in NORM}
    return names


def read_like_detectron2(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        data = pickle.load(f, encoding="latin1")
    assert "model" in data and "__author__" in data  # detectron2's model-zoo format test
    return data


def test_vissl_resnet50_checkpoint_to_detectron2_pkl(tmp_path: Path) -> None:
    cfg = AttrDict(copy.deepcopy(_MODEL))
    cfg.TRUNK.RESNETS.update({"DEPTH": 50, "WIDTH_MULTIPLIER": 0.25})
    cfg.HEAD.PARAMS = []
    trunk = randomize(build_model(cfg, AttrDict())).trunk.state_dict()
    torch.save(
        {"classy_state_dict": {"base_model": {"model": {"trunk": trunk, "heads": {}}}}},
        tmp_path / "c.torch",
    )
    code, out, _ = run_as_main(
        "convert_vissl_to_detectron2", str(tmp_path / "c.torch"), str(tmp_path / "r50.pkl")
    )
    assert code == 0, out
    data = read_like_detectron2(tmp_path / "r50.pkl")
    assert data["__author__"] == "vissl" and data["matching_heuristics"] is True
    assert set(data["model"]) == detectron2_resnet_names((3, 4, 6, 3), bottleneck=True)
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in data["model"].values())
    np.testing.assert_array_equal(
        data["model"]["res3.0.conv2.norm.running_var"],
        trunk["_feature_blocks.layer2.0.bn2.running_var"].numpy(),
    )
    np.testing.assert_array_equal(
        data["model"]["res5.0.shortcut.weight"],
        trunk["_feature_blocks.layer4.0.downsample.0.weight"].numpy(),
    )
    config = yaml.safe_load(out.split("(MODEL.WEIGHTS: the file):\n", 1)[1])
    resnets = config["MODEL"]["RESNETS"]
    assert resnets == {
        "DEPTH": 50,
        "NUM_GROUPS": 1,
        "WIDTH_PER_GROUP": 16,
        "STEM_OUT_CHANNELS": 16,
        "RES2_OUT_CHANNELS": 64,
        "STRIDE_IN_1X1": False,
    }
    assert config["INPUT"]["FORMAT"] == "RGB"


def test_torchvision_resnet18_state_dict_with_vissl_flags(tmp_path: Path) -> None:
    state = torchvision.models.resnet18().state_dict()
    torch.save(state, tmp_path / "r18.pth")
    out = str(tmp_path / "r18.pkl")
    code, _, err = run_as_main(
        "convert_vissl_to_detectron2",
        *[
            "--input_model_file",
            str(tmp_path / "r18.pth"),
            "--output_model",
            out,
            "--weights_type",
            "torch",
        ],
    )
    assert code == 0, err
    data = read_like_detectron2(Path(out))
    assert set(data["model"]) == detectron2_resnet_names((2, 2, 2, 2), bottleneck=False)
    np.testing.assert_array_equal(data["model"]["stem.conv1.weight"], state["conv1.weight"].numpy())


def test_what_detectron2_cannot_take_is_a_one_line_error(tmp_path: Path) -> None:
    torch.save(torchvision.models.resnet18().state_dict(), tmp_path / "r18.pth")
    code, _, err = run_as_main(
        "convert_vissl_to_detectron2", str(tmp_path / "r18.pth"), str(tmp_path / "r18.torch")
    )
    assert_one_line_error(code, err, "name the output *.pkl")
    small = torchvision.models.resnet18().state_dict()
    small["conv1.weight"] = torch.zeros(64, 3, 3, 3)
    torch.save(small, tmp_path / "small.pth")
    code, _, err = run_as_main(
        "convert_vissl_to_detectron2", str(tmp_path / "small.pth"), str(tmp_path / "s.pkl")
    )
    assert_one_line_error(code, err, "small-image stem")
    assert not (tmp_path / "s.pkl").exists()
    assert d2.detectron2_name("layer1.0.bn1.num_batches_tracked") is None

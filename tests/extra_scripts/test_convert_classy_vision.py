"""extra_scripts/convert_vissl_to_classy_vision.py and convert_classy_vision_to_vissl.py.

ClassyVision's side is tests/_reference_models.py (ClassyVision's ResNe(X)t and VISSL's
RegNet, written from their naming schemes): the converted trunk must load strictly into it
and give our trunk's features; converted back, it must be the same tensors and initialise
a fresh model through MODEL.WEIGHTS_INIT to the same features.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

import vissl
from tests._reference_models import ClassyResNet, VisslRegNet, randomize
from tests.extra_scripts._helpers import assert_one_line_error, import_script, run_as_main
from vissl.config.attr_dict import AttrDict
from vissl.models import build_model
from vissl.utils.checkpoint import load_checkpoint
from vissl.utils.weights_init import init_model_from_weights_params_file

to_classy = import_script("convert_vissl_to_classy_vision")
to_vissl = import_script("convert_classy_vision_to_vissl")

torch.set_num_threads(1)
_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]
BN = ("weight", "bias", "running_mean", "running_var")
#: A SimCLR-like stack of two one-layer mlp heads, BatchNorm in the first.
HEADS = [
    [
        "mlp",
        {"dims": [512, 64], "use_relu": True, "use_bn": True, "skip_last_layer_relu_bn": False},
    ],
    ["mlp", {"dims": [64, 16]}],
]


def build(trunk: dict[str, Any], heads: list[Any] | None = None) -> Any:
    cfg = AttrDict(copy.deepcopy(_MODEL))
    cfg.TRUNK.update(trunk)
    cfg.HEAD.PARAMS = heads or []
    model = build_model(cfg, AttrDict())
    return randomize(model)


def save_ours(model: Any, path: Path) -> Path:
    state = model.state_dict()
    parts = {
        "trunk": {k[len("trunk.") :]: v for k, v in state.items() if k.startswith("trunk.")},
        "heads": {k[len("heads.") :]: v for k, v in state.items() if k.startswith("heads.")},
    }
    torch.save({"classy_state_dict": {"base_model": {"model": parts, "meta": {}}}}, path)
    return path


def fresh_load(trunk: dict[str, Any], path: Path) -> Any:
    model = build(trunk)
    init_model_from_weights_params_file(model, {"PARAMS_FILE": str(path)}, model.model_config)
    return model.eval()


@pytest.mark.parametrize(
    ("depth", "small_stem", "layers", "bottleneck"),
    [(50, False, (3, 4, 6, 3), True), (18, True, (2, 2, 2, 2), False)],
)
def test_resnet_to_classy_vision_and_back(
    tmp_path: Path, depth: int, small_stem: bool, layers: tuple[int, ...], bottleneck: bool
) -> None:
    trunk = {
        "NAME": "resnet",
        "RESNETS": {"DEPTH": depth, "WIDTH_MULTIPLIER": 0.25, "SMALL_IMAGE_STEM": small_stem},
    }
    ours = build(trunk, HEADS if bottleneck else None)
    source = save_ours(ours, tmp_path / "ours.torch")
    flags = ["--include-heads"] if bottleneck else []
    assert to_classy.main([str(source), str(tmp_path / "classy.torch"), *flags]) == 0
    classy = load_checkpoint(str(tmp_path / "classy.torch"))["classy_state_dict"]["base_model"][
        "model"
    ]

    reference = ClassyResNet(layers, width=16, bottleneck=bottleneck, small_input=small_stem).eval()
    reference.load_state_dict(classy["trunk"], strict=True)  # exactly ClassyVision's names
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(reference(x), ours.trunk(x)[0], rtol=1e-5, atol=1e-5)
    if bottleneck:
        # VISSL's head conversion, written out: heads on ResNet-50's last block block3-2
        expected = {"mlp.layers.0.fc.weight", "mlp.layers.0.fc.bias", "embedding_fc.weight"}
        expected |= {f"mlp.layers.0.batch_norm.{p}" for p in BN} | {"embedding_fc.bias"}
        assert list(classy["heads"]) == ["block3-2"]
        assert set(classy["heads"]["block3-2"]["default_head"]) == expected

    assert to_vissl.main([str(tmp_path / "classy.torch"), str(tmp_path / "back.torch")]) == 0
    back = load_checkpoint(str(tmp_path / "back.torch"))["classy_state_dict"]["base_model"]["model"]
    original = {
        k[len("trunk.") :]: v for k, v in ours.state_dict().items() if k.startswith("trunk.")
    }
    assert back["trunk"].keys() == original.keys()
    assert all(torch.equal(back["trunk"][k], v) for k, v in original.items())
    with torch.no_grad():
        loaded = fresh_load(trunk, tmp_path / "back.torch")
        torch.testing.assert_close(loaded.trunk(x)[0], ours.trunk(x)[0], rtol=1e-5, atol=1e-5)
        # WEIGHTS_INIT reads ClassyVision's names without the conversion
        direct = fresh_load(trunk, tmp_path / "classy.torch")
        torch.testing.assert_close(direct.trunk(x)[0], ours.trunk(x)[0], rtol=1e-5, atol=1e-5)


REGNET_TRUNK = {
    "NAME": "regnet",
    "REGNET": {"depth": 3, "w_0": 16, "w_a": 8.0, "w_m": 2.0, "group_width": 8, "stem_width": 8},
}


def _classy_regnet_names() -> set[str]:
    """ClassyVision's RegNet model names of that RegNet (stages [16, 32] x [1, 2]),
    written out from ClassyVision's scheme: ``stem.stem``, ``trunk_output.block{s}``."""
    names = {"stem.stem.0.weight"} | {f"stem.stem.1.{p}" for p in (*BN, "num_batches_tracked")}
    for block, proj in (
        ("block1.block1-0", True),
        ("block2.block2-0", True),
        ("block2.block2-1", False),
    ):
        pre = f"trunk_output.{block}."
        bn = (*BN, "num_batches_tracked")
        if proj:
            names |= {pre + "proj.weight"} | {pre + f"bn.{p}" for p in bn}
        for conv in ("a", "b"):
            names |= {pre + f"f.{conv}.0.weight"} | {pre + f"f.{conv}.1.{p}" for p in bn}
        names |= {pre + f"f.se.excitation.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")}
        names |= {pre + "f.c.weight"} | {pre + f"f.final_bn.{p}" for p in bn}
    return names


def test_regnet_to_classy_vision_layouts_and_back(tmp_path: Path) -> None:
    ours = build(REGNET_TRUNK)
    source = save_ours(ours, tmp_path / "ours.torch")
    assert to_classy.main([str(source), str(tmp_path / "classy.torch")]) == 0
    assert (
        to_classy.main([str(source), str(tmp_path / "vissl.torch"), "--regnet-layout", "vissl"])
        == 0
    )
    classy = load_checkpoint(str(tmp_path / "classy.torch"))["classy_state_dict"]["base_model"][
        "model"
    ]
    vissl_names = load_checkpoint(str(tmp_path / "vissl.torch"))["classy_state_dict"]["base_model"][
        "model"
    ]
    assert set(classy["trunk"]) == _classy_regnet_names()
    reference = VisslRegNet([16, 32], [1, 2], stem_width=8, group_width=8).eval()
    reference.load_state_dict(vissl_names["trunk"], strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(reference(x), ours.trunk(x)[0], rtol=1e-5, atol=1e-5)
    for name in ("classy", "vissl"):
        code, out, _ = run_as_main(
            "convert_classy_vision_to_vissl",
            str(tmp_path / f"{name}.torch"),
            str(tmp_path / "b.torch"),
        )
        assert code == 0 and "stage widths [16, 32], depths [1, 2]" in out
        with torch.no_grad():
            loaded = fresh_load(REGNET_TRUNK, tmp_path / "b.torch")
            torch.testing.assert_close(loaded.trunk(x)[0], ours.trunk(x)[0], rtol=1e-5, atol=1e-5)


def test_vissl_flags_are_checked_against_the_weights(tmp_path: Path) -> None:
    trunk = {"NAME": "resnet", "RESNETS": {"DEPTH": 50, "WIDTH_MULTIPLIER": 0.25}}
    source = str(save_ours(build(trunk, HEADS), tmp_path / "ours.torch"))
    out = str(tmp_path / "classy.torch")
    vissl_flags = ["--input_model_file", source, "--output_model", out, "--include_heads"]
    code, stdout, _ = run_as_main(
        "convert_vissl_to_classy_vision",
        *vissl_flags,
        *["--depth", "50", "--num_fc_layers", "2", "--use_bn_head", "--use_bias_head_fc"],
    )
    assert code == 0 and "block3-2" in stdout
    code, _, err = run_as_main("convert_vissl_to_classy_vision", *vissl_flags, "--depth", "101")
    assert_one_line_error(code, err, "--depth 101", "ResNet-50")
    code, _, err = run_as_main(
        "convert_vissl_to_classy_vision", *vissl_flags, "--num_fc_layers", "3"
    )
    assert_one_line_error(code, err, "--num_fc_layers says 3", "2 head(s)")
    # VISSL's name of the reverse script, with VISSL's flags
    code, stdout, _ = run_as_main(
        "convert_classy_vision_to_vissl_resnet",
        *[
            "--input_model_file",
            out,
            "--output_model",
            str(tmp_path / "back.torch"),
            "--depth",
            "50",
        ],
    )
    assert code == 0 and "config.MODEL.TRUNK.RESNETS.DEPTH=50" in stdout


def test_inputs_without_a_classy_counterpart_are_one_line_errors(tmp_path: Path) -> None:
    vit = {"NAME": "vision_transformer", "VISION_TRANSFORMERS": {"name": "tiny", "IMAGE_SIZE": 32}}
    source = str(save_ours(build(vit), tmp_path / "vit.torch"))
    code, _, err = run_as_main("convert_vissl_to_classy_vision", source, str(tmp_path / "o.torch"))
    assert_one_line_error(code, err, "neither our resnet nor our regnet trunk")
    torch.save({"conv1.weight": torch.zeros(1)}, tmp_path / "plain.pth")
    code, _, err = run_as_main(
        "convert_classy_vision_to_vissl", str(tmp_path / "plain.pth"), "o.torch"
    )
    assert_one_line_error(code, err, "no ClassyVision ResNe(X)t")
    code, _, err = run_as_main(
        "convert_vissl_to_classy_vision", str(tmp_path / "missing.torch"), "o"
    )
    assert_one_line_error(code, err, "does not exist")

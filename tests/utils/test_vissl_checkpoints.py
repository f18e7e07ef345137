"""VISSL's RegNet and ViT checkpoints load into our trunks through MODEL.WEIGHTS_INIT.

The VISSL-side weights come from tests/_reference_models.py, small models written from
ClassyVision's, VISSL's and DINO's naming schemes (never downloaded, no VISSL file): their
state dicts are saved in VISSL's checkpoint layout, loaded with ``PARAMS_FILE`` alone, and
the loaded trunk must give the reference model's features.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

import vissl
from tests._reference_models import ClassyViT, DinoViT, VisslRegNet, randomize
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import build_model
from vissl.utils.vissl_key_maps import (
    classy_model_name_to_vissl,
    regnet_name_to_classy,
    regnet_name_to_ours,
    vissl_name_to_classy_model,
)
from vissl.utils.weights_init import init_model_from_weights_params_file

torch.set_num_threads(1)

_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL_DEFAULTS: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]

# A small RegNetY: depth 3, w_0 16, w_a 8, w_m 2. By hand: the block widths u_j = 16 + 8j
# are 16, 24, 32; quantised to w_0 * w_m^round(log2(u_j / 16)) they are 16, 32, 32, so two
# stages of widths [16, 32] and depths [1, 2]; group width 8 keeps them (groups 2 and 4).
REGNET = {"depth": 3, "w_0": 16, "w_a": 8.0, "w_m": 2.0, "group_width": 8, "stem_width": 8}
REGNET_WIDTHS, REGNET_DEPTHS = [16, 32], [1, 2]

# Names of that RegNet in VISSL's (ClassyVision's) spelling, written out from
# ClassyVision's anynet.py scheme: SimpleStemIN.stem = [conv, bn, act]; ResBottleneckBlock
# = proj, bn (only when the shape changes), f = BottleneckTransform(a = [conv, bn, act],
# b = [conv, bn, act], se.excitation = [conv, act, conv, sigmoid], c, final_bn).
_BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _expected_vissl_regnet_names() -> list[str]:
    names = ["_feature_blocks.conv1.stem.0.weight"]
    names += [f"_feature_blocks.conv1.stem.1.{p}" for p in _BN]
    for block, has_proj in (
        ("res2.block1-0", True),
        ("res3.block2-0", True),
        ("res3.block2-1", False),
    ):
        pre = f"_feature_blocks.{block}."
        if has_proj:
            names += [pre + "proj.weight"] + [pre + f"bn.{p}" for p in _BN]
        for conv in ("a", "b"):
            names += [pre + f"f.{conv}.0.weight"] + [pre + f"f.{conv}.1.{p}" for p in _BN]
        names += [pre + f"f.se.excitation.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")]
        names += [pre + "f.c.weight"] + [pre + f"f.final_bn.{p}" for p in _BN]
    return names


def model_config(trunk: str, params: dict[str, Any]) -> AttrDict:
    cfg = AttrDict(copy.deepcopy(_MODEL_DEFAULTS))
    cfg.TRUNK.NAME = trunk
    cfg.TRUNK["REGNET" if trunk.startswith("regnet") else "VISION_TRANSFORMERS"] = params
    cfg.HEAD.PARAMS = []
    return cfg


def build(trunk: str, params: dict[str, Any]) -> Any:
    return build_model(model_config(trunk, params), AttrDict()).eval()


def vissl_checkpoint(trunk_state: dict[str, torch.Tensor], path: Path) -> Path:
    """``trunk_state`` in VISSL's checkpoint layout."""
    model = {"trunk": trunk_state, "heads": {}}
    torch.save({"classy_state_dict": {"base_model": {"model": model, "meta": {}}}}, path)
    return path


def load(model: Any, path: Path) -> None:
    init_model_from_weights_params_file(model, {"PARAMS_FILE": str(path)}, model.model_config)


@pytest.fixture(scope="module")
def reference_regnet() -> VisslRegNet:
    return randomize(VisslRegNet(REGNET_WIDTHS, REGNET_DEPTHS, stem_width=8, group_width=8))  # type: ignore[return-value]


def test_regnet_names_map_both_ways_one_to_one(reference_regnet: VisslRegNet) -> None:
    ours = [k for k in build("regnet", REGNET).trunk.state_dict()]
    expected = _expected_vissl_regnet_names()
    assert sorted(reference_regnet.state_dict()) == sorted(expected)  # the reference is VISSL's
    prefix = "_feature_blocks."
    to_classy = {k: prefix + regnet_name_to_classy(k[len(prefix) :]) for k in ours}
    assert sorted(to_classy.values()) == sorted(expected)  # a bijection onto VISSL's names
    for mine, theirs in to_classy.items():
        assert prefix + regnet_name_to_ours(theirs[len(prefix) :]) == mine
    # ClassyVision's own model names (stem, trunk_output.block{s}) and back
    for name in expected:
        rest = name[len(prefix) :]
        classy = vissl_name_to_classy_model(rest)
        assert classy.startswith(
            ("stem.stem.", "trunk_output.block1.block1-", "trunk_output.block2.block2-")
        )
        assert classy_model_name_to_vissl(classy) == rest


def test_vissl_regnet_checkpoint_loads_strict_with_equal_features(
    tmp_path: Path, reference_regnet: VisslRegNet
) -> None:
    """The issue's check: VISSL's names load strict into ``regnet``; equal features."""
    path = vissl_checkpoint(reference_regnet.state_dict(), tmp_path / "vissl_regnet.torch")
    model = build("regnet", REGNET)
    load(model, path)  # strict: every model tensor must come from the file
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.trunk(x)[0], reference_regnet(x), rtol=1e-5, atol=1e-5)


def test_seer_grouped_fsdp_regnet_and_classy_model_layouts_load(
    tmp_path: Path, reference_regnet: VisslRegNet
) -> None:
    """SEER's regnet_fsdp layout (blocks grouped by stage_checkpoints, FSDP wrapper
    levels) under a ``regnet_fsdp`` config, and ClassyVision's RegNet model as a plain
    state dict."""
    seer: dict[str, torch.Tensor] = {}
    for name, tensor in reference_regnet.state_dict().items():
        # stage_checkpoints [[], [1]]: res3's block 0 in part0, block 1 in part1
        name = name.replace("res2.block1-0.", "res2.block1-part0.block1-0.")
        name = name.replace("res3.block2-0.", "res3.block2-part0._fsdp_wrapped_module.block2-0.")
        name = name.replace("res3.block2-1.", "res3.block2-part1.block2-1._fpw_module.")
        seer[name] = tensor
    model = build("regnet_fsdp", {**REGNET, "stage_checkpoints": [[], [1]]})
    load(model, vissl_checkpoint(seer, tmp_path / "seer.torch"))
    classy = {
        vissl_name_to_classy_model(k[len("_feature_blocks.") :]): v
        for k, v in reference_regnet.state_dict().items()
    }
    torch.save(classy, tmp_path / "classy_regnet.pth")
    plain = build("regnet", REGNET)
    load(plain, tmp_path / "classy_regnet.pth")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = reference_regnet(x)
        torch.testing.assert_close(model.trunk(x)[0], expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(plain.trunk(x)[0], expected, rtol=1e-5, atol=1e-5)


def test_a_vissl_regnet_of_another_size_lists_the_mismatch(
    tmp_path: Path, reference_regnet: VisslRegNet
) -> None:
    path = vissl_checkpoint(reference_regnet.state_dict(), tmp_path / "vissl_regnet.torch")
    model = build("regnet", {**REGNET, "depth": 4})  # one more block in res3
    with pytest.raises(ConfigError, match=r"missing in the file \(\d+\): .*res3\.block2-2"):
        load(model, path)


VIT = {
    "IMAGE_SIZE": 32,
    "PATCH_SIZE": 8,
    "HIDDEN_DIM": 32,
    "NUM_LAYERS": 2,
    "NUM_HEADS": 4,
    "MLP_DIM": 64,
    "QKV_BIAS": True,
}


def test_vissl_and_dino_vit_weights_load_with_equal_features(tmp_path: Path) -> None:
    """VISSL's vision_transformer checkpoint (with an iBOT mask token our trunk has no use
    for) and DINO's backbone file (its own names, no prefix)."""
    reference = randomize(DinoViT(32, 8, 32, 2, 4, 64))
    state = dict(reference.state_dict())
    vissl_state = {**state, "patch_masking.masked_embed": torch.zeros(1, 32)}
    from_vissl = build("vision_transformer", VIT)
    load(from_vissl, vissl_checkpoint(vissl_state, tmp_path / "vissl_vit.torch"))
    torch.save(state, tmp_path / "dino_deitsmall8_pretrain.pth")
    from_dino = build("vision_transformer", VIT)
    load(from_dino, tmp_path / "dino_deitsmall8_pretrain.pth")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = reference(x)
        torch.testing.assert_close(from_vissl.trunk(x)[0], expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(from_dino.trunk(x)[0], expected, rtol=1e-5, atol=1e-5)


def test_vissl_classy_vit_checkpoint_loads_with_equal_features(tmp_path: Path) -> None:
    reference = randomize(ClassyViT(32, 8, 32, 2, 4, 64))
    path = vissl_checkpoint(reference.state_dict(), tmp_path / "classy_vit.torch")
    model = build("vision_transformer", VIT)
    load(model, path)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.trunk(x)[0], reference(x), rtol=1e-5, atol=1e-5)

    gap = randomize(ClassyViT(32, 8, 32, 2, 4, 64, token=False))
    path = vissl_checkpoint(gap.state_dict(), tmp_path / "classy_vit_gap.torch")
    with pytest.raises(ConfigError, match="without a class token"):
        load(build("vision_transformer", VIT), path)

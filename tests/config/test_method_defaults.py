"""The defaults a module keeps for its keys equal the ones defaults.yaml lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import vissl
from vissl.config.params import as_dict, parse
from vissl.losses import LOSS_REGISTRY, moco_v3_loss, vicreg_loss
from vissl.models.trunks import vision_transformer

_YAML = Path(vissl.__file__).parent / "config" / "defaults.yaml"


def _section(path: str) -> dict[str, Any]:
    node: Any = OmegaConf.to_container(OmegaConf.load(_YAML))
    for part in path.split("."):
        node = node[part]
    return node


@pytest.mark.parametrize(
    "path,defaults",
    [
        ("config.LOSS.moco_v3_loss", as_dict(moco_v3_loss.MoCoV3Params())),
        ("config.LOSS.vicreg_loss", as_dict(vicreg_loss.VICRegParams())),
        ("config.MODEL.TRUNK.VISION_TRANSFORMERS", vision_transformer.DEFAULTS),
    ],
)
def test_module_defaults_equal_defaults_yaml(path: str, defaults: dict[str, Any]) -> None:
    section = _section(path)
    assert {k: section.get(k, "<missing>") for k in defaults} == defaults


@pytest.mark.parametrize(
    "name", sorted(n for n in LOSS_REGISTRY.names() if hasattr(LOSS_REGISTRY.get(n), "Params"))
)
def test_a_loss_params_declare_every_key_of_its_defaults_yaml_block(name: str) -> None:
    """The parser refuses undeclared keys: every key defaults.yaml gives the block (and so
    every composed config) must be declared by the loss's Params."""
    cls = LOSS_REGISTRY.get(name)
    parse(cls.Params, _section(f"config.LOSS.{name}"), f"config.LOSS.{name}")

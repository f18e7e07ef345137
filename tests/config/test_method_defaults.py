"""The defaults a module keeps for its keys equal the ones defaults.yaml lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

import vissl
from vissl.losses import moco_v3_loss, vicreg_loss
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
        ("config.LOSS.moco_v3_loss", moco_v3_loss.DEFAULTS),
        ("config.LOSS.vicreg_loss", vicreg_loss.DEFAULTS),
        ("config.MODEL.TRUNK.VISION_TRANSFORMERS", vision_transformer.DEFAULTS),
    ],
)
def test_module_defaults_equal_defaults_yaml(path: str, defaults: dict[str, Any]) -> None:
    section = _section(path)
    assert {k: section.get(k, "<missing>") for k in defaults} == defaults

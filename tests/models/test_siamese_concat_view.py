"""``siamese_concat_view``: each image's ``num_towers`` patch features side by side, checked
against a concatenation written by hand; and Jigsaw's head chain in a built model
(per-patch mlp, concatenation, permutation classifier) against the same steps by hand."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import build_model
from vissl.models.heads import get_model_head

_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL_DEFAULTS: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]


def _by_hand(x: torch.Tensor, towers: int) -> torch.Tensor:
    """Row i: the features of rows i * towers .. i * towers + towers - 1, one after another."""
    flat = x.reshape(x.shape[0], -1)
    return torch.stack(
        [
            torch.cat([flat[i * towers + t] for t in range(towers)])
            for i in range(x.shape[0] // towers)
        ]
    )


@pytest.mark.parametrize("shape", [(12, 5), (12, 5, 1, 1)])
def test_concatenates_each_images_tower_features(shape: tuple[int, ...]) -> None:
    head = get_model_head("siamese_concat_view")(AttrDict({}), num_towers=3)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    out = head(x)
    assert out.shape == (4, 15)
    torch.testing.assert_close(out, _by_hand(x, 3), rtol=0, atol=0)
    torch.testing.assert_close(head([x]), out, rtol=0, atol=0)  # a list of one tensor


def test_gradients_reach_every_tower() -> None:
    head = get_model_head("siamese_concat_view")(None, num_towers=9)
    x = torch.randn(18, 4, requires_grad=True)
    weights = torch.arange(2 * 36, dtype=torch.float32).reshape(2, 36)
    (head(x) * weights).sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, weights.reshape(18, 4))


@pytest.mark.parametrize("towers", [0, -9, 2.0, "9", True])
def test_bad_num_towers_names_the_key(towers: Any) -> None:
    with pytest.raises(ConfigError) as err:
        get_model_head("siamese_concat_view")(None, num_towers=towers)
    assert err.value.key_path == "config.MODEL.HEAD.PARAMS"


def test_rows_not_a_multiple_of_num_towers() -> None:
    head = get_model_head("siamese_concat_view")(None, num_towers=9)
    with pytest.raises(ValueError, match="20 rows, not a multiple of num_towers=9"):
        head(torch.zeros(20, 4))


def test_jigsaw_head_chain_in_a_model_equals_the_steps_by_hand() -> None:
    cfg = AttrDict(copy.deepcopy(_MODEL_DEFAULTS))
    cfg.TRUNK.RESNETS.DEPTH = 18
    cfg.TRUNK.RESNETS.WIDTH_MULTIPLIER = 0.25
    cfg.TRUNK.RESNETS.SMALL_IMAGE_STEM = True
    cfg.HEAD.PARAMS = [
        [
            "mlp",
            {"dims": [128, 16], "use_bn": True, "use_relu": True, "skip_last_layer_relu_bn": False},
        ],
        ["siamese_concat_view", {"num_towers": 9}],
        ["mlp", {"dims": [144, 10]}],
    ]
    torch.manual_seed(0)
    model = build_model(cfg, AttrDict({})).eval()
    patches = torch.randn(2 * 9, 3, 8, 8)
    with torch.no_grad():
        logits = model(patches)[0]
        features = model.trunk(patches)
        features = features[0] if isinstance(features, list) else features
        per_patch = model.heads[0](features.flatten(1))
        joined = _by_hand(per_patch, 9)
        expected = model.heads[2](joined)
    assert logits.shape == (2, 10)
    torch.testing.assert_close(logits, expected)
    # the same puzzle with image 1's patches first gives the rows swapped
    swapped = torch.cat([patches[9:], patches[:9]])
    with torch.no_grad():
        torch.testing.assert_close(model(swapped)[0], logits.flip(0))

"""MODEL.MULTI_INPUT_HEAD_MAPPING (VISSL's PIRL models): head i runs on the trunk features
of the input named by mapping entry i; one output per entry."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.models.test_models_base_model import DIM, build, model_config
from vissl.errors import ConfigError

MAPPING = [["patches", ["flatten"]], ["images", ["flatten"]]]
PIRL_HEADS = [
    [
        ["mlp", {"dims": [DIM, 4], "use_bn": False, "use_relu": False}],
        ["siamese_concat_view", {"num_towers": 9}],
        ["mlp", {"dims": [36, 8]}],
    ],
    [["mlp", {"dims": [DIM, 8]}]],
]


def _model(heads: list[Any] = PIRL_HEADS, mapping: Any = MAPPING) -> Any:
    cfg = model_config(heads)
    cfg.MULTI_INPUT_HEAD_MAPPING = mapping
    return build(cfg).eval()


def test_each_input_goes_through_the_trunk_and_its_own_head() -> None:
    model = _model()
    images, patches = torch.randn(2, 3, 16, 16), torch.randn(18, 3, 8, 8)
    out = model({"images": images, "patches": patches})
    assert [o.shape for o in out] == [(2, 8), (2, 8)]
    with torch.no_grad():
        torch.testing.assert_close(out[0], model.heads[0](model.trunk(patches)[0]))
        torch.testing.assert_close(out[1], model.heads[1](model.trunk(images)[0]))


def test_a_flat_head_list_gives_one_module_per_input() -> None:
    model = _model([["mlp", {"dims": [DIM, 8]}], ["mlp", {"dims": [DIM, 3]}]])
    x = torch.randn(2, 3, 16, 16)
    out = model({"images": x, "patches": x})
    assert [o.shape for o in out] == [(2, 8), (2, 3)]


@pytest.mark.parametrize(
    ("mapping", "match"),
    [
        ([["images"]], r"MULTI_INPUT_HEAD_MAPPING\[0\] must be"),
        ([["images", "flatten"]], r"MULTI_INPUT_HEAD_MAPPING\[0\] must be"),
        ([["images", ["flatten"]], ["images", ["flatten"]]], "a second time"),
        ([["images", ["flatten"]]], "2 heads"),
        ("images", "must be a list"),
    ],
)
def test_mapping_mistakes_are_config_errors(mapping: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _model(mapping=mapping)


def test_a_head_too_narrow_for_its_input_is_caught_at_build() -> None:
    with pytest.raises(ConfigError, match="width"):
        _model([["mlp", {"dims": [DIM, 8]}], ["mlp", {"dims": [DIM + 1, 3]}]])


def test_missing_inputs_and_unmapped_named_inputs_are_explained() -> None:
    model = _model()
    with pytest.raises(ConfigError, match="'patches'"):
        model({"images": torch.randn(2, 3, 16, 16)})
    with pytest.raises(ConfigError, match="INPUT_KEY_NAMES"):
        model(torch.randn(2, 3, 16, 16))
    plain = build(model_config([["mlp", {"dims": [DIM, 8]}]]))
    with pytest.raises(ConfigError, match="MULTI_INPUT_HEAD_MAPPING is empty"):
        plain({"images": torch.randn(2, 3, 16, 16)})

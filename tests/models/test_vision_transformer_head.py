"""``vision_transformer_head``: VISSL's layer names, the ViT paper's two forms, its init."""

from __future__ import annotations

import math

import pytest
import torch

from vissl.errors import ConfigError
from vissl.models.heads import get_model_head


def test_linear_and_hidden_forms_with_vissls_names() -> None:
    head_cls = get_model_head("vision_transformer_head")
    linear = head_cls({}, in_plane=16, num_classes=5)
    assert list(linear.state_dict()) == ["layers.head.weight", "layers.head.bias"]
    x = torch.randn(4, 16)
    torch.testing.assert_close(linear(x), x @ linear.layers.head.weight.T)  # zero bias
    mlp = head_cls({}, in_plane=16, num_classes=5, hidden_dim=32)
    assert list(mlp.state_dict()) == [
        "layers.pre_logits.weight",
        "layers.pre_logits.bias",
        "layers.head.weight",
        "layers.head.bias",
    ]
    hidden = torch.tanh(x @ mlp.layers.pre_logits.weight.T)
    torch.testing.assert_close(mlp(x), hidden @ mlp.layers.head.weight.T)


def test_initialisation() -> None:
    torch.manual_seed(0)
    head = get_model_head("vision_transformer_head")({}, 400, 300, hidden_dim=500)
    pre, last = head.layers.pre_logits.weight, head.layers.head.weight
    # LeCun normal: std 1/sqrt(fan_in) (truncation at +-2 cuts nothing at this std)
    assert pre.std().item() == pytest.approx(1 / math.sqrt(400), rel=0.02)
    # std 0.02, truncated at +-2 (nothing cut)
    assert last.std().item() == pytest.approx(0.02, rel=0.02)
    assert head.layers.pre_logits.bias.abs().sum() == 0 and head.layers.head.bias.abs().sum() == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"in_plane": 0, "num_classes": 10},
        {"in_plane": 8, "num_classes": 2.5},
        {"in_plane": 8, "num_classes": 10, "hidden_dim": -1},
    ],
)
def test_bad_sizes_are_config_errors(kwargs: dict) -> None:
    with pytest.raises(ConfigError) as err:
        get_model_head("vision_transformer_head")({}, **kwargs)
    assert err.value.key_path.startswith("config.MODEL.HEAD.PARAMS[vision_transformer_head].")


def test_feature_size_mismatch_is_named() -> None:
    head = get_model_head("vision_transformer_head")({}, in_plane=8, num_classes=3)
    with pytest.raises(ConfigError, match="in_plane=8"):
        head(torch.zeros(2, 12))

"""dino_head: layers and output shape, the weight-normalised last layer (fixed or learnable
row norms), size errors, and its parameter names in a model."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import OmegaConf

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import build_model
from vissl.models.heads import get_model_head
from vissl.models.heads.dino_head import DINOHead, WeightNormLinear

KEY = "config.MODEL.HEAD.PARAMS"


def make_head(**kw: Any) -> DINOHead:
    args: dict[str, Any] = dict(
        in_dim=16, num_clusters=[10], hidden_dim=32, bottleneck_dim=8, num_layers=3
    )
    args.update(kw)
    torch.manual_seed(0)
    return DINOHead({}, **args)


def test_registered_layers_and_output_shape() -> None:
    head = get_model_head("dino_head")(
        {}, in_dim=16, num_clusters=[10], hidden_dim=32, bottleneck_dim=8, use_bn=True
    )
    kinds = [type(m) for m in head.mlp]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.GELU] * 2 + [nn.Linear]
    assert [m.out_features for m in head.mlp if isinstance(m, nn.Linear)] == [32, 32, 8]
    assert head.prototypes0.weight.shape == (10, 8)
    x = torch.randn(5, 16)
    out = head(x)
    assert out.shape == (5, 10) and head.output_dim == 10
    assert torch.allclose(head(x.view(5, 16, 1, 1)), out)  # a trunk's map is flattened
    assert torch.allclose(head([x]), out)  # a list of one tensor
    with pytest.raises(ValueError, match="list of 2"):
        head([x, x])
    one = make_head(num_layers=1, num_clusters=7)  # an int is one size
    assert [type(m) for m in one.mlp] == [nn.Linear] and one.mlp[0].out_features == 8
    assert one(x).shape == (5, 7)


def test_output_is_the_normalised_bottleneck_scored_by_unit_rows() -> None:
    head = make_head()
    x = torch.randn(5, 16)
    w = head.prototypes0.normalized_weight()
    assert torch.allclose(w.norm(dim=1), torch.ones(10), atol=1e-6)
    assert head.prototypes0.scale is None
    assert [n for n, _ in head.prototypes0.named_parameters()] == ["weight"]
    bottleneck = F.normalize(head.mlp(x), dim=1)
    expected = bottleneck @ F.normalize(head.prototypes0.weight, dim=1).t()
    torch.testing.assert_close(head(x), expected)
    assert head(x).abs().max() <= 1 + 1e-6  # cosines
    with torch.no_grad():
        head.prototypes0.weight.mul_(3.0)  # the direction alone matters
    torch.testing.assert_close(head(x), expected)


def test_without_normalize_last_layer_each_row_has_a_learnable_scale() -> None:
    head = make_head(normalize_last_layer=False)
    layer = head.prototypes0
    assert isinstance(layer.scale, nn.Parameter) and layer.scale.requires_grad
    assert layer.scale.shape == (10, 1) and torch.equal(layer.scale, torch.ones(10, 1))
    with torch.no_grad():
        layer.scale.copy_(torch.arange(1.0, 11.0).unsqueeze(1))
    norms = layer.normalized_weight().norm(dim=1)
    torch.testing.assert_close(norms, torch.arange(1.0, 11.0))
    head(torch.randn(4, 16)).sum().backward()
    assert layer.scale.grad is not None and layer.scale.grad.abs().sum() > 0


def test_weight_norm_linear_matches_torch_weight_norm() -> None:
    torch.manual_seed(1)
    layer = WeightNormLinear(6, 4, learn_scale=True)
    with torch.no_grad():
        layer.scale.copy_(torch.rand(4, 1) + 0.5)
    ref = nn.Linear(6, 4, bias=False)
    ref = nn.utils.parametrizations.weight_norm(ref, dim=0)
    with torch.no_grad():
        ref.parametrizations.weight.original0.copy_(layer.scale)
        ref.parametrizations.weight.original1.copy_(layer.weight)
    x = torch.randn(3, 6)
    torch.testing.assert_close(layer(x), ref(x))


def test_input_width_other_than_in_dim() -> None:
    head = make_head()
    with pytest.raises(ConfigError, match="in_dim is 16") as err:
        head(torch.randn(4, 12))
    assert err.value.key_path == KEY


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"num_clusters": [10, 20]}, "num_clusters"),
        ({"num_clusters": []}, "num_clusters"),
        ({"num_clusters": [0]}, "num_clusters"),
        ({"in_dim": 0}, "in_dim"),
        ({"num_layers": 0}, "num_layers"),
        ({"bottleneck_dim": 2.5}, "bottleneck_dim"),
    ],
)
def test_bad_sizes_are_config_errors(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=name) as err:
        make_head(**kwargs)
    assert err.value.key_path.startswith(f"{KEY}[dino_head].{name}")


_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"


def test_in_a_model_the_last_layer_is_heads_0_prototypes0() -> None:
    model_cfg = AttrDict(
        copy.deepcopy(OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL))
    )
    model_cfg.TRUNK.RESNETS.DEPTH = 18
    model_cfg.TRUNK.RESNETS.WIDTH_MULTIPLIER = 0.25
    model_cfg.TRUNK.RESNETS.SMALL_IMAGE_STEM = True
    model_cfg.HEAD.PARAMS = [
        ["dino_head", {"in_dim": 128, "num_clusters": [12], "hidden_dim": 16, "bottleneck_dim": 8}]
    ]
    model = build_model(model_cfg, AttrDict({}))
    names = dict(model.named_parameters())
    assert "heads.0.prototypes0.weight" in names  # what TEMP_FROZEN_PARAMS_ITER_MAP names
    out = model(torch.randn(2, 3, 16, 16))
    out = out[0] if isinstance(out, list | tuple) else out
    assert out.shape == (2, 12)


def _mean_row_norm(weight: torch.Tensor) -> float:
    return weight.detach().norm(dim=1).mean().item()


def test_last_layer_starts_as_nn_linear_as_in_dino() -> None:
    """facebookresearch/dino ``vision_transformer.py::DINOHead`` makes its weight-normalised
    last layer after ``self.apply(self._init_weights)``: it keeps ``nn.Linear``'s default
    init (rows of norm ~sqrt(1/3) = 0.577 for any input width), not the MLP's
    trunc-normal 0.02 (0.32 at bottleneck 256)."""
    torch.manual_seed(0)
    head = DINOHead({}, 384, [65536], hidden_dim=2048, bottleneck_dim=256)
    reference = _mean_row_norm(nn.Linear(256, 65536, bias=False).weight)
    assert reference == pytest.approx(0.577, abs=0.01)
    assert _mean_row_norm(head.prototypes0.weight) == pytest.approx(reference, abs=0.01)
    bound = 1 / 256**0.5  # nn.Linear's U(+-1/sqrt(in))
    assert head.prototypes0.weight.abs().max() <= bound
    # the MLP keeps DINO's trunc-normal 0.02
    first = head.mlp[0].weight
    assert first.std().item() == pytest.approx(0.02, rel=0.05)


def test_a_checkpoint_of_the_old_init_loads() -> None:
    """Only the init changed: a head saved before (its last layer trunc-normal) loads."""
    old = make_head(normalize_last_layer=False)
    with torch.no_grad():
        nn.init.trunc_normal_(old.prototypes0.weight, std=0.02)
    new = make_head(normalize_last_layer=False)
    new.load_state_dict(old.state_dict())
    x = torch.randn(3, 16)
    old.eval(), new.eval()
    assert torch.equal(new(x), old(x))

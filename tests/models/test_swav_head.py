"""swav_head: layers, output layout, prototype names, normalisation, in a model."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn
from omegaconf import OmegaConf

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import build_model
from vissl.models.heads import get_model_head
from vissl.models.heads.swav_head import SwAVHead, find_swav_heads

_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]


def model_config(head_params: list[Any]) -> AttrDict:
    cfg = AttrDict(copy.deepcopy(_MODEL))
    cfg.TRUNK.RESNETS.DEPTH = 18
    cfg.TRUNK.RESNETS.WIDTH_MULTIPLIER = 0.25
    cfg.TRUNK.RESNETS.SMALL_IMAGE_STEM = True
    cfg.HEAD.PARAMS = head_params
    return cfg


def test_layers_and_output_layout() -> None:
    head = get_model_head("swav_head")(
        {}, dims=[16, 32, 8], use_bn=True, num_clusters=[10, 7], use_bias=False
    )
    kinds = [type(m) for m in head.projection_head]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU, nn.Linear]
    assert head.projection_head[0].bias is None
    assert head.prototypes0.bias is None and head.prototypes0.weight.shape == (10, 8)
    assert head.prototypes1.weight.shape == (7, 8)
    x = torch.randn(5, 16, 1, 1)  # trunk output with spatial dims is flattened
    emb, s0, s1 = head(x)
    assert emb.shape == (5, 8) and s0.shape == (5, 10) and s1.shape == (5, 7)
    assert torch.allclose(emb.norm(dim=1), torch.ones(5), atol=1e-6)
    assert torch.allclose(s0, emb @ head.prototypes0.weight.t())


def test_options() -> None:
    head = SwAVHead({}, dims=[16, 32, 8], use_bn=False, num_clusters=[4], skip_last_bn=False)
    assert [type(m) for m in head.projection_head] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU]
    head = SwAVHead(
        {}, dims=[16, 8], num_clusters=[4], return_embeddings=False, normalize_feats=False
    )
    out = head([torch.randn(3, 16)])
    assert len(out) == 1 and out[0].shape == (3, 4)
    identity = SwAVHead({}, dims=[6], num_clusters=3)
    x = torch.randn(2, 6)
    assert torch.allclose(identity(x)[0], torch.nn.functional.normalize(x, dim=1))


def test_normalize_prototypes() -> None:
    head = SwAVHead({}, dims=[8, 4], num_clusters=[5, 3])
    head.normalize_prototypes()
    for layer in head.prototype_layers():
        assert torch.allclose(layer.weight.norm(dim=1), torch.ones(layer.weight.shape[0]))


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="num_clusters"):
        SwAVHead({}, dims=[8, 4], num_clusters=[0])
    with pytest.raises(ConfigError, match="dims"):
        SwAVHead({}, dims=[], num_clusters=[3])
    with pytest.raises(ConfigError, match="output nothing"):
        SwAVHead({}, dims=[8, 4], num_clusters=[], return_embeddings=False)


def test_in_a_model_prototype_names_and_clustering() -> None:
    params = [["swav_head", {"dims": [128, 64, 16], "use_bn": True, "num_clusters": [20]}]]
    model = build_model(model_config(params), None)
    names = dict(model.named_parameters())
    assert "heads.0.prototypes0.weight" in names
    assert model.is_clustering_model()
    assert len(find_swav_heads(model)) == 1
    model.eval()
    out = model(torch.randn(2, 3, 8, 8))
    assert len(out) == 1 and len(out[0]) == 2
    assert out[0][0].shape == (2, 16) and out[0][1].shape == (2, 20)

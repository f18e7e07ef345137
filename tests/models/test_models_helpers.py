"""model_helpers: feature selection, SyncBN conversion, NaN check."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.models import convert_sync_bn, model_output_has_nan
from vissl.models.model_helpers import (
    Flatten,
    get_trunk_forward_outputs,
    split_world_in_process_groups,
)

torch.set_num_threads(2)


def test_get_trunk_forward_outputs_mapping_and_default() -> None:
    blocks = nn.ModuleDict(
        {"conv1": nn.Conv2d(3, 4, 3), "relu": nn.ReLU(), "pool": nn.AdaptiveAvgPool2d(1)}
    )
    blocks["flatten"] = Flatten(1)
    mapping = {"conv1": "relu", "avg": "pool"}
    x = torch.randn(2, 3, 8, 8)
    (default,) = get_trunk_forward_outputs(x, None, blocks, mapping)
    assert default.shape == (2, 4)
    conv1, avg, raw = get_trunk_forward_outputs(x, ["conv1", "avg", "flatten"], blocks, mapping)
    assert conv1.min() >= 0  # "conv1" is the VISSL name of the ReLU output
    assert avg.shape == (2, 4, 1, 1) and raw.shape == (2, 4)
    with pytest.raises(ConfigError):
        get_trunk_forward_outputs(x, ["nope"], blocks, mapping)


def test_split_world_in_process_groups() -> None:
    assert split_world_in_process_groups(9, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert split_world_in_process_groups(4, 2) == [[0, 1], [2, 3]]


def test_convert_sync_bn_is_a_no_op_with_one_process() -> None:
    cfg = AttrDict(
        {
            "MODEL": {
                "SYNC_BN_CONFIG": {
                    "CONVERT_BN_TO_SYNC_BN": True,
                    "SYNC_BN_TYPE": "pytorch",
                    "GROUP_SIZE": 0,
                }
            }
        }
    )
    model = convert_sync_bn(cfg, nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)))
    assert type(model[1]) is nn.BatchNorm2d
    cfg.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE = "nvidia"
    with pytest.raises(ConfigError) as e:
        convert_sync_bn(cfg, nn.BatchNorm2d(4))
    assert e.value.key_path == "config.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE"


def test_model_output_has_nan() -> None:
    ok = torch.zeros(2)
    assert not model_output_has_nan([ok, [ok]])
    assert model_output_has_nan([ok, [torch.tensor([float("nan")])]])

"""Head input widths are checked when the model is built (vissl/models/shape_check.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn

from tests.models.test_models_base_model import DIM, build, model_config
from vissl.errors import ConfigError
from vissl.models.shape_check import check_head_input_widths


def build_error(head_params: list[Any]) -> str:
    with pytest.raises(ConfigError) as err:
        build(model_config(head_params))
    assert err.value.key_path == "config.MODEL.HEAD.PARAMS"
    return str(err.value)


def test_a_first_head_of_the_wrong_width_names_its_key_and_both_widths() -> None:
    message = build_error([["mlp", {"dims": [100, 64]}]])
    assert message.startswith(
        f"config.MODEL.HEAD.PARAMS[0]: head 'mlp' takes inputs of width 100 but the trunk's "
        f"output has width {DIM}: set the head's input width (its first `dims` entry) to {DIM}."
    )


def test_a_chained_head_is_checked_against_the_head_before_it() -> None:
    message = build_error([["mlp", {"dims": [DIM, 64]}], ["mlp", {"dims": [32, 8]}]])
    assert "config.MODEL.HEAD.PARAMS[1]: head 'mlp' takes inputs of width 32" in message
    assert "the output of config.MODEL.HEAD.PARAMS[0] (mlp) has width 64" in message


def test_parallel_chains_name_the_chain_and_the_entry() -> None:
    message = build_error(
        [
            [["mlp", {"dims": [DIM, 16]}]],
            [["mlp", {"dims": [DIM, 32]}], ["mlp", {"dims": [16, 4]}]],
        ]
    )
    assert "config.MODEL.HEAD.PARAMS[1][1]: head 'mlp' takes inputs of width 16" in message
    assert "the output of config.MODEL.HEAD.PARAMS[1][0] (mlp) has width 32" in message


@pytest.mark.parametrize(
    "head_params",
    [
        [],
        [["mlp", {"dims": [DIM, 64]}], ["mlp", {"dims": [64, 8]}]],
        [
            [["mlp", {"dims": [DIM, 16]}]],
            [["mlp", {"dims": [DIM, 32]}], ["mlp", {"dims": [32, 4]}]],
        ],
        [["swav_head", {"dims": [DIM, 32, 16], "num_clusters": [10]}]],
        [["eval_mlp", {"in_channels": DIM, "dims": [DIM, 10]}]],
    ],
)
def test_heads_that_fit_build_and_run(head_params: list[Any]) -> None:
    model = build(model_config(head_params)).eval()
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))


def test_the_real_parameters_are_untouched_by_the_check() -> None:
    model = build(model_config([["mlp", {"dims": [DIM, 8]}]]))
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert all(b.device.type == "cpu" for b in model.buffers())
    assert int(model.trunk._feature_blocks.bn1.num_batches_tracked) == 0


def test_a_width_that_depends_on_the_input_size_is_left_to_the_forward_pass() -> None:
    """A flattened feature map (res5 without pooling) has a size-dependent width: the check
    cannot know the training size, so it does not reject a head sized for 64 px inputs,
    while the same head on the pooled output is rejected."""
    model = build(model_config([]))
    head = nn.Sequential(nn.Flatten(), nn.Linear(DIM * 4, 8))  # res5 at 64 px: DIM x 2 x 2
    check_head_input_widths(model.trunk, ["res5"], [head], [["mlp"]], parallel=False)
    assert head(model.trunk(torch.randn(2, 3, 64, 64), ["res5"])[0]).shape == (2, 8)
    with pytest.raises(ConfigError, match=f"takes inputs of width {DIM * 4} but"):
        check_head_input_widths(model.trunk, ["flatten"], [head], [["mlp"]], parallel=False)

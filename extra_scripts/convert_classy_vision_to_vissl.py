#!/usr/bin/env python3
"""Convert a ClassyVision ResNe(X)t or RegNet checkpoint to a file vissl's WEIGHTS_INIT loads.

The input is a ClassyVision checkpoint (``classy_state_dict.base_model.model.trunk``, as
ClassyVision and VISSL's ``convert_vissl_to_classy_vision.py`` write it), or a plain state
dict of such a model. Its trunk is renamed to ours and written in vissl's checkpoint layout
(``classy_state_dict.base_model.model.trunk``), which
``config.MODEL.WEIGHTS_INIT.PARAMS_FILE`` loads with no other WEIGHTS_INIT key:

- ClassyVision's ResNe(X)t (``initial_block._module.*``, ``blocks.{s}.block{s}-{i}.*``)
  -> our ``resnet`` trunk (torchvision's names under ``_feature_blocks.``); the result is
  loaded strictly into our trunk of the same shape, whose overrides are printed.
- ClassyVision's RegNet model (``stem.stem.*``, ``trunk_output.block{s}.*``) or VISSL's
  ``regnet`` trunk (``_feature_blocks.conv1.stem.*``; SEER's grouped stages too) -> our
  ``regnet`` trunk; the stage widths and depths are printed (give the trunk the same
  ``config.MODEL.TRUNK.REGNET``).

ClassyVision's heads are not converted (their names are ClassyVision's own). VISSL called
this script ``convert_classy_vision_to_vissl_resnet.py`` (ResNets only, written under
``model_state_dict``); that name works too, with its flags.

examples:
  python extra_scripts/convert_classy_vision_to_vissl.py classy_rn50.torch rn50_vissl.torch
  python extra_scripts/convert_classy_vision_to_vissl.py \\
      --input_model_file classy_rn50.torch --output_model rn50_vissl.torch

Exit codes: 0 converted, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# the sibling scripts, also when this file is run by runpy (as the docs checks do)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import HelpFormatter, ScriptError, run_script
from _vissl_checkpoints import check_resnet_trunk, load_file, model_parts, save, vissl_checkpoint

from vissl.utils.vissl_key_maps import (
    FEATURE_BLOCKS,
    classy_model_name_to_vissl,
    classy_resnet_name_to_ours,
    regnet_name_to_ours,
)

_STAGE_BLOCK = re.compile(r"^res(\d+)\.block\d+-(\d+)\.f\.c\.0\.weight$")


def classy_resnet_to_vissl(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ClassyVision ResNe(X)t names -> our ``resnet`` trunk names."""
    bottleneck = any(k.endswith(".convolutional_block.6.weight") for k in state)
    return {FEATURE_BLOCKS + classy_resnet_name_to_ours(k, bottleneck): v for k, v in state.items()}


def classy_regnet_to_vissl(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ClassyVision RegNet model names, or VISSL's regnet trunk names -> ours."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        rest = (
            key[len(FEATURE_BLOCKS) :]
            if key.startswith(FEATURE_BLOCKS)
            else classy_model_name_to_vissl(key)
        )
        out[FEATURE_BLOCKS + regnet_name_to_ours(rest)] = value
    return out


def regnet_stages(trunk: Mapping[str, torch.Tensor]) -> tuple[list[int], list[int]]:
    """(widths, depths) of our RegNet trunk's stages, read from the weights."""
    stages: dict[int, tuple[int, int]] = {}
    for key, value in trunk.items():
        match = _STAGE_BLOCK.match(key[len(FEATURE_BLOCKS) :])
        if match:
            stage, block = int(match.group(1)), int(match.group(2))
            width, depth = stages.get(stage, (int(value.shape[0]), 0))
            stages[stage] = (width, max(depth, block + 1))
    return [stages[s][0] for s in sorted(stages)], [stages[s][1] for s in sorted(stages)]


@dataclass
class Converted:
    """The output file, what it holds, and how to use it."""

    checkpoint: dict[str, Any]
    kind: str
    tensors: int
    depth: int | None
    usage: str


def convert(checkpoint: Mapping[str, Any], state_dict_key: str | None, what: str) -> Converted:
    """The trunk of a ClassyVision checkpoint (or state dict) in vissl's layout.

    Raises:
        ScriptError: no ClassyVision ResNe(X)t or RegNet trunk, or one that does not fit.
    """
    trunk, _, _ = model_parts(checkpoint, state_dict_key, what)
    if any(k.endswith("initial_block._module.0.weight") for k in trunk):
        converted = classy_resnet_to_vissl(trunk)
        shape = check_resnet_trunk(converted, f"{what}'s trunk")
        usage = "use it with:\n  " + " ".join(shape.overrides())
        return Converted(
            vissl_checkpoint(converted), f"ResNet-{shape.depth}", len(converted), shape.depth, usage
        )
    if any(k.startswith(("stem.stem.", f"{FEATURE_BLOCKS}conv1.stem.")) for k in trunk):
        converted = classy_regnet_to_vissl(trunk)
        widths, depths = regnet_stages(converted)
        usage = (
            f"stage widths {widths}, depths {depths}: use it with config.MODEL.TRUNK.NAME=regnet "
            "and the config.MODEL.TRUNK.REGNET parameters of the model it comes from"
        )
        return Converted(vissl_checkpoint(converted), "RegNet", len(converted), None, usage)
    raise ScriptError(
        f"{what} holds no ClassyVision ResNe(X)t (initial_block._module.*) or RegNet "
        f"(stem.stem.*) trunk; its keys look like {sorted(trunk)[:3]}."
    )


def _parser(
    prog: str = "extra_scripts/convert_classy_vision_to_vissl.py",
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("input", nargs="?", help="the ClassyVision checkpoint or state dict")
    parser.add_argument("output", nargs="?", help="the file to write")
    parser.add_argument(
        "--state-dict-key",
        "--state_dict_key_name",
        dest="state_dict_key",
        default=None,
        help="where the model is (default: classy_state_dict if the file has it, else the "
        "file itself or its model_state_dict / state_dict / model entry)",
    )
    vissl = parser.add_argument_group("VISSL's flags")
    vissl.add_argument("--input_model_file", default=None, help="the input (instead of INPUT)")
    vissl.add_argument("--output_model", default=None, help="the output (instead of OUTPUT)")
    vissl.add_argument("--depth", type=int, default=None, help="the ResNet's depth (checked)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = _parser(prog or "extra_scripts/convert_classy_vision_to_vissl.py").parse_args(argv)
    source = args.input_model_file or args.input
    target = args.output_model or args.output
    if (args.input_model_file and args.input) or (args.output_model and args.output):
        raise ScriptError("give INPUT OUTPUT or --input_model_file/--output_model, not both.")
    if not source or not target:
        raise ScriptError("give the INPUT file and the OUTPUT file (see --help).")
    result = convert(load_file(source), args.state_dict_key, source)
    if args.depth is not None and args.depth != result.depth:
        raise ScriptError(f"--depth {args.depth}, but {source} holds a {result.kind} trunk.")
    save(result.checkpoint, target)
    print(f"wrote the vissl {result.kind} trunk ({result.tensors} tensors) to {target}")
    print(result.usage)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

#!/usr/bin/env python3
"""Convert the trunk (and optionally the heads) of a vissl checkpoint to ClassyVision's names.

The trunk of a vissl (or VISSL) checkpoint is renamed to the ClassyVision model it
corresponds to and written in ClassyVision's checkpoint layout,
``classy_state_dict.base_model.model.{trunk, heads}``, as VISSL's script of this name does:

- ``resnet`` trunk -> ClassyVision's ResNe(X)t: ``initial_block._module.{0,1}`` (stem conv
  and BatchNorm), ``blocks.{s}.block{s}-{i}.convolutional_block.{0,1,3,4,6}`` (conv1, bn1,
  conv2, bn2, conv3), the block's last BatchNorm as ``bn``, ``downsample`` as is. Any depth
  (VISSL converted 50 and 101 only), width and group setting.
- ``regnet`` trunk (ours, or VISSL's with ClassyVision's block names, SEER's grouped
  stages included) -> ClassyVision's RegNet model: ``stem.stem.{0,1}``,
  ``trunk_output.block{s}.block{s}-{i}.{proj, bn, f.a, f.b, f.se.excitation, f.c,
  f.final_bn}``. ``--regnet-layout vissl`` writes VISSL's ``regnet`` trunk names
  (``_feature_blocks.conv1.stem.*``, ``_feature_blocks.res{s+1}.*``) instead.

``--include-heads`` also converts the heads when they are a stack of one-layer ``mlp``
heads (a Linear, optionally followed by BatchNorm; e.g. SimCLR's two heads, NPID's one),
as VISSL does: head ``i`` but the last becomes ``mlp.layers.{i}.fc`` (and
``mlp.layers.{i}.batch_norm``), the last ``{PREFIX}_fc`` (``--output-head-prefix``,
default ``embedding``), all in ClassyVision's head ``default_head`` on the trunk's last
block (``block3-2`` for a ResNet-50). Whether the heads have biases and BatchNorm is read
from the weights; VISSL's flags saying otherwise are an error.

Every converted name is mapped back and compared with the input before the file is written.
``extra_scripts/convert_classy_vision_to_vissl.py`` goes the other way, and
``MODEL.WEIGHTS_INIT`` reads ClassyVision's ResNet and RegNet names directly.

examples:
  python extra_scripts/convert_vissl_to_classy_vision.py \\
      checkpoints/run/model_final_checkpoint_phase99.torch rn50_classy.torch
  python extra_scripts/convert_vissl_to_classy_vision.py CKPT OUT --include-heads
  # VISSL's flags work too
  python extra_scripts/convert_vissl_to_classy_vision.py --input_model_file CKPT \\
      --output_model OUT --depth 50 --include_heads --num_fc_layers 2 --use_bias_head_fc

Exit codes: 0 converted, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch

# the sibling scripts, also when this file is run by runpy (as the docs checks do)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import HelpFormatter, ScriptError, run_script
from _vissl_checkpoints import (
    check_resnet_trunk,
    is_regnet_trunk,
    is_resnet_trunk,
    is_vissl_regnet_trunk,
    load_file,
    model_parts,
    save,
)

from vissl.utils.vissl_key_maps import (
    FEATURE_BLOCKS,
    classy_model_name_to_vissl,
    classy_resnet_name_to_ours,
    regnet_name_to_classy,
    regnet_name_to_ours,
    resnet_name_to_classy,
    vissl_name_to_classy_model,
)

REGNET_LAYOUTS = ("classy", "vissl")
_HEAD_KEY = re.compile(r"^(\d+)\.clf\.([01])\.(\w+)$")
_BN_PARAMS = ("weight", "bias", "running_mean", "running_var")


# ---------------------------------------------------------------------- trunk
def _strip(trunk: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k[len(FEATURE_BLOCKS) :]: v for k, v in trunk.items()}


def resnet_to_classy(trunk: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our ``resnet`` trunk (``_feature_blocks.*``) in ClassyVision's ResNe(X)t names."""
    rest = _strip(trunk)
    bottleneck = "layer1.0.conv3.weight" in rest
    out = {resnet_name_to_classy(k, bottleneck): v for k, v in rest.items()}
    back = {FEATURE_BLOCKS + classy_resnet_name_to_ours(k, bottleneck) for k in out}
    assert back == set(trunk) and len(out) == len(trunk), "the ResNet name maps disagree"
    return out


def regnet_to_classy(trunk: Mapping[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """A ``regnet`` trunk (ours, or VISSL's names) in ClassyVision's model names
    (``layout`` classy) or VISSL's ``regnet`` trunk names (``layout`` vissl)."""
    ours = {regnet_name_to_ours(k): v for k, v in _strip(trunk).items()}
    vissl = {regnet_name_to_classy(k): v for k, v in ours.items()}
    assert {regnet_name_to_ours(k) for k in vissl} == set(ours), "the RegNet name maps disagree"
    if layout == "vissl":
        return {FEATURE_BLOCKS + k: v for k, v in vissl.items()}
    out = {vissl_name_to_classy_model(k): v for k, v in vissl.items()}
    assert {classy_model_name_to_vissl(k) for k in out} == set(vissl)
    return out


def _last_block(trunk: Mapping[str, torch.Tensor], resnet: bool) -> str:
    """ClassyVision's name of the trunk's last block, where its heads attach."""
    pattern = (
        r"^blocks\.(\d+)\.block\d+-(\d+)\."
        if resnet
        else r"^trunk_output\.block(\d+)\.block\d+-(\d+)\."
    )
    found = [(int(m.group(1)), int(m.group(2))) for k in trunk if (m := re.match(pattern, k))]
    stage, block = max(found)
    return f"block{stage}-{block}"


# ---------------------------------------------------------------------- heads
def heads_to_classy(
    heads: Mapping[str, torch.Tensor],
    prefix: str,
    num_fc_layers: int | None,
    use_bn: bool | None,
    use_bias: bool | None,
    what: str,
) -> dict[str, torch.Tensor]:
    """A stack of one-layer ``mlp`` heads in ClassyVision's names (VISSL's conversion).

    Raises:
        ScriptError: the heads are not such a stack, or VISSL's flags contradict them.
    """
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in heads.items():
        match = _HEAD_KEY.match(key)
        if key.endswith("num_batches_tracked"):
            continue
        if not match or (match.group(2) == "0" and match.group(3) not in ("weight", "bias")):
            raise ScriptError(
                f"--include-heads: {what}'s heads are not a stack of one-layer mlp heads "
                f"(Linear, optionally BatchNorm): {key!r}. Convert the trunk only."
            )
        layers.setdefault(int(match.group(1)), {})[f"{match.group(2)}.{match.group(3)}"] = value
    if not layers:
        raise ScriptError(f"--include-heads: {what} has no head weights.")
    n = len(layers)
    if sorted(layers) != list(range(n)):
        raise ScriptError(f"--include-heads: {what}'s heads are numbered {sorted(layers)}.")
    has_bn = any("1.running_mean" in layer for layer in layers.values())
    has_bias = all("0.bias" in layer for layer in layers.values())
    given: dict[str, tuple[int | bool | None, int | bool]] = {
        "--num_fc_layers": (num_fc_layers, n),
        "--use_bn_head": (use_bn, has_bn),
        "--use_bias_head_fc": (use_bias, has_bias),
    }
    for flag, (said, found) in given.items():
        if said is not None and said != found:
            raise ScriptError(
                f"{flag} says {said} but {what}'s heads have {found} "
                f"({n} head(s), BatchNorm {has_bn}, biases {has_bias}); leave the flag out."
            )
    out: dict[str, torch.Tensor] = {}
    for i in range(n):
        layer = layers[i]
        fc = f"mlp.layers.{i}.fc" if i < n - 1 else f"{prefix}_fc"
        out[f"{fc}.weight"] = layer["0.weight"]
        if "0.bias" in layer:
            out[f"{fc}.bias"] = layer["0.bias"]
        if i < n - 1 and "1.running_mean" in layer:
            for param in _BN_PARAMS:
                out[f"mlp.layers.{i}.batch_norm.{param}"] = layer[f"1.{param}"]
        elif "1.running_mean" in layer:
            raise ScriptError(
                f"--include-heads: {what}'s last head ends in BatchNorm, which ClassyVision's "
                "head (VISSL's conversion) has no place for."
            )
    return out


# ---------------------------------------------------------------------- command line
def convert(
    checkpoint: Mapping[str, Any], args: argparse.Namespace, what: str
) -> tuple[dict[str, Any], str]:
    """The output file and a one-line description of what was converted."""
    trunk, heads, is_vissl = model_parts(checkpoint, args.state_dict_key, what)
    if not is_vissl:
        raise ScriptError(
            f"{what} is not a vissl checkpoint (no base_model.model.trunk under "
            f"{args.state_dict_key or 'classy_state_dict'!r})."
        )
    if is_resnet_trunk(trunk):
        shape = check_resnet_trunk(trunk, f"{what}'s trunk")
        if args.depth is not None and args.depth != shape.depth:
            raise ScriptError(
                f"--depth {args.depth}, but {what}'s trunk is a ResNet-{shape.depth}."
            )
        converted = resnet_to_classy(trunk)
        name = f"ResNet-{shape.depth}" + (
            f" {shape.groups}x{shape.width_per_group}d" if shape.groups > 1 else ""
        )
        resnet = True
    elif is_regnet_trunk(trunk) or is_vissl_regnet_trunk(trunk):
        if args.depth is not None:
            raise ScriptError("--depth is for ResNets; this trunk is a RegNet.")
        converted = regnet_to_classy(trunk, args.regnet_layout)
        name = "RegNet"
        resnet = False
    else:
        raise ScriptError(
            f"{what}'s trunk is neither our resnet nor our regnet trunk (keys such as "
            f"{sorted(trunk)[:3]}); only those two have ClassyVision counterparts."
        )
    model: dict[str, Any] = {"trunk": converted, "heads": {}}
    summary = f"the {name} trunk ({len(converted)} tensors)"
    if args.include_heads:
        if not resnet and args.regnet_layout == "vissl":
            raise ScriptError(
                "--include-heads writes ClassyVision heads: use --regnet-layout classy."
            )
        block = _last_block(converted, resnet)
        head = heads_to_classy(
            heads,
            args.output_head_prefix,
            args.num_fc_layers,
            args.use_bn_head,
            args.use_bias_head_fc,
            what,
        )
        model["heads"] = {block: {"default_head": head}}
        summary += f" and its heads as default_head on {block} ({len(head)} tensors)"
    return {"classy_state_dict": {"base_model": {"model": model}}}, summary


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="extra_scripts/convert_vissl_to_classy_vision.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("input", nargs="?", help="the vissl (or VISSL) checkpoint")
    parser.add_argument("output", nargs="?", help="the file to write")
    parser.add_argument(
        "--state-dict-key",
        "--state_dict_key_name",
        dest="state_dict_key",
        default=None,
        help="where the model is, as MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME (default "
        "classy_state_dict; ema_model for the EMA weights)",
    )
    parser.add_argument(
        "--regnet-layout",
        choices=REGNET_LAYOUTS,
        default="classy",
        help="RegNet names: ClassyVision's RegNet model (classy) or VISSL's regnet trunk (vissl)",
    )
    parser.add_argument(
        "--include-heads",
        "--include_heads",
        dest="include_heads",
        action="store_true",
        help="also convert the heads (a stack of one-layer mlp heads)",
    )
    parser.add_argument(
        "--output-head-prefix",
        "--output_head_prefix",
        dest="output_head_prefix",
        default="embedding",
        help="the last head becomes PREFIX_fc",
    )
    vissl = parser.add_argument_group("VISSL's flags (checked against the weights)")
    vissl.add_argument("--input_model_file", default=None, help="the input (instead of INPUT)")
    vissl.add_argument("--output_model", default=None, help="the output (instead of OUTPUT)")
    vissl.add_argument("--depth", type=int, default=None, help="the ResNet's depth")
    vissl.add_argument("--num_fc_layers", type=int, default=None, help="number of heads")
    vissl.add_argument(
        "--use_bn_head", action="store_const", const=True, default=None, help="heads have BatchNorm"
    )
    vissl.add_argument(
        "--use_bias_head_fc",
        action="store_const",
        const=True,
        default=None,
        help="the heads' Linear layers have biases",
    )
    return parser


def paths(args: argparse.Namespace) -> tuple[str, str]:
    """``(input, output)`` from INPUT OUTPUT or VISSL's --input_model_file/--output_model."""
    source = args.input_model_file or args.input
    target = args.output_model or args.output
    if (args.input_model_file and args.input) or (args.output_model and args.output):
        raise ScriptError("give INPUT OUTPUT or --input_model_file/--output_model, not both.")
    if not source or not target:
        raise ScriptError("give the INPUT file and the OUTPUT file (see --help).")
    return source, target


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    source, target = paths(args)
    output, summary = convert(load_file(source), args, source)
    save(output, target)
    print(f"wrote {summary} in ClassyVision's names to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

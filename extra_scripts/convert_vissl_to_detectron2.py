#!/usr/bin/env python3
"""Convert a vissl ResNet trunk to a detectron2 ``.pkl`` backbone file (without detectron2).

The ``resnet`` trunk of a vissl (or VISSL) checkpoint, or a torchvision ResNet state dict,
is renamed to detectron2's ResNet names and pickled in the layout detectron2's
``DetectionCheckpointer`` reads from a ``.pkl`` file: ``{"model": {name: numpy array},
"__author__": "vissl", "matching_heuristics": True}`` (the matching heuristics let
detectron2 find ``backbone.bottom_up.res2...`` from ``res2...``).

=====================================  ==========================================
ours (torchvision's)                   detectron2
=====================================  ==========================================
``_feature_blocks.conv1.weight``       ``stem.conv1.weight``
``_feature_blocks.bn1.*``              ``stem.conv1.norm.*``
``_feature_blocks.layer{n}.{b}.conv{k}``  ``res{n+1}.{b}.conv{k}``
``_feature_blocks.layer{n}.{b}.bn{k}.*``  ``res{n+1}.{b}.conv{k}.norm.*``
``...downsample.0.weight``             ``res{n+1}.{b}.shortcut.weight``
``...downsample.1.*``                  ``res{n+1}.{b}.shortcut.norm.*``
=====================================  ==========================================

BatchNorm's ``num_batches_tracked`` is left out (detectron2's FrozenBatchNorm has none).
The script prints the detectron2 config the weights need: our ResNets (torchvision's)
stride in the 3x3 convolution (``MODEL.RESNETS.STRIDE_IN_1X1: False``), take RGB in
[0, 255] normalised with ImageNet's statistics (``INPUT.FORMAT``, ``MODEL.PIXEL_MEAN`` /
``PIXEL_STD``), and have the depth, groups and widths read from the weights. Only the
ImageNet stem converts (detectron2's stem is a 7x7 convolution and a max-pool), not
``SMALL_IMAGE_STEM``.

examples:
  python extra_scripts/convert_vissl_to_detectron2.py \\
      checkpoints/run/model_final_checkpoint_phase99.torch rn50_d2.pkl
  # VISSL's flags work too (--weights_type is read from the weights and may be left out)
  python extra_scripts/convert_vissl_to_detectron2.py --input_model_file CKPT \\
      --output_model rn50_d2.pkl --state_dict_key_name classy_state_dict --weights_type torch

Exit codes: 0 converted, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import yaml

# the sibling scripts, also when this file is run by runpy (as the docs checks do)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import HelpFormatter, ScriptError, run_script
from _vissl_checkpoints import ResNetShape, check_resnet_trunk, load_file, model_parts

from vissl.utils.vissl_key_maps import FEATURE_BLOCKS

#: ImageNet's statistics in [0, 255], the normalisation our trunks are trained with.
PIXEL_MEAN = [123.675, 116.28, 103.53]
PIXEL_STD = [58.395, 57.12, 57.375]

_LAYER = re.compile(r"^layer(\d)\.(\d+)\.(.+)$")


def detectron2_name(name: str) -> str | None:
    """The detectron2 name of a torchvision ResNet name; None for what detectron2 lacks
    (``num_batches_tracked``, ``fc``)."""
    if name.endswith("num_batches_tracked") or name.startswith("fc."):
        return None
    if name.startswith("conv1."):
        return "stem." + name
    if name.startswith("bn1."):
        return "stem.conv1.norm." + name[len("bn1.") :]
    match = _LAYER.match(name)
    if not match:
        raise ScriptError(f"{name!r} is not a torchvision ResNet name.")
    stage, block, inner = int(match.group(1)) + 1, match.group(2), match.group(3)
    if inner.startswith("downsample.0."):
        inner = "shortcut." + inner[len("downsample.0.") :]
    elif inner.startswith("downsample.1."):
        inner = "shortcut.norm." + inner[len("downsample.1.") :]
    elif re.match(r"^bn\d\.", inner):
        inner = f"conv{inner[2]}.norm.{inner[4:]}"
    return f"res{stage}.{block}.{inner}"


def to_detectron2(state: Mapping[str, torch.Tensor]) -> OrderedDict[str, np.ndarray]:
    """torchvision ResNet names and tensors -> detectron2 names and float32 numpy arrays."""
    out: OrderedDict[str, np.ndarray] = OrderedDict()
    for name, value in state.items():
        new = detectron2_name(name)
        if new is not None:
            out[new] = value.detach().cpu().float().numpy()
    assert len(set(out)) == len(out), "two names map to one detectron2 name"
    return out


def detectron2_config(shape: ResNetShape, input_type: str) -> dict[str, Any]:
    """The detectron2 config keys that fit weights of ``shape``."""
    resnets: dict[str, Any] = {
        "DEPTH": shape.depth,
        "NUM_GROUPS": shape.groups,
        "WIDTH_PER_GROUP": shape.width_per_group * shape.width // 64,
        "STEM_OUT_CHANNELS": shape.width,
        "RES2_OUT_CHANNELS": shape.width * (4 if shape.bottleneck else 1),
        "STRIDE_IN_1X1": False,
    }
    # a bgr trunk's weights see BGR channels: detectron2 then feeds BGR, statistics in BGR
    bgr = input_type == "bgr"
    mean, std = (PIXEL_MEAN[::-1], PIXEL_STD[::-1]) if bgr else (PIXEL_MEAN, PIXEL_STD)
    return {
        "MODEL": {"PIXEL_MEAN": mean, "PIXEL_STD": std, "RESNETS": resnets},
        "INPUT": {"FORMAT": "BGR" if bgr else "RGB"},
    }


def yaml_lines(config: Mapping[str, Any], indent: str = "") -> list[str]:
    """``config`` as YAML: nested mappings as blocks, lists on one line."""
    lines = []
    for key, value in config.items():
        if isinstance(value, Mapping):
            lines += [f"{indent}{key}:", *yaml_lines(value, indent + "  ")]
        else:
            text = (
                yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            )
            lines.append(f"{indent}{key}: {text}")
    return lines


def _input_type(checkpoint: Mapping[str, Any]) -> str:
    text = checkpoint.get("config")
    if not isinstance(text, str):
        return "rgb"
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        return "rgb"
    model = (config or {}).get("config", {}).get("MODEL") or {}
    return str(model.get("INPUT_TYPE", "rgb") or "rgb")


def convert(
    checkpoint: Mapping[str, Any], state_dict_key: str | None, what: str
) -> tuple[dict[str, Any], ResNetShape, str]:
    """``(the .pkl content, the ResNet's shape, its input type)``."""
    trunk, _, is_vissl = model_parts(checkpoint, state_dict_key, what)
    if not is_vissl and not any(k.startswith(FEATURE_BLOCKS) for k in trunk):
        trunk = {FEATURE_BLOCKS + k: v for k, v in trunk.items() if not k.startswith("fc.")}
    if not any(k.startswith(f"{FEATURE_BLOCKS}layer1.0.") for k in trunk):
        raise ScriptError(
            f"{what}'s trunk is not a ResNet (keys such as {sorted(trunk)[:3]}); detectron2's "
            "backbone takes our resnet trunk only."
        )
    shape = check_resnet_trunk(trunk, f"{what}'s trunk")
    if shape.small_image_stem:
        raise ScriptError(
            f"{what}'s trunk has the small-image stem (3x3 conv1, RESNETS.SMALL_IMAGE_STEM); "
            "detectron2's stem is a 7x7 convolution and a max-pool."
        )
    if not shape.bottleneck and shape.width != 64:
        raise ScriptError(
            f"{what}'s trunk is a ResNet-{shape.depth} of width {shape.width}; detectron2 builds "
            "ResNet-18/34 at width 64 only (RES2_OUT_CHANNELS 64)."
        )
    model = to_detectron2({k[len(FEATURE_BLOCKS) :]: v for k, v in trunk.items()})
    pkl = {"model": model, "__author__": "vissl", "matching_heuristics": True}
    return pkl, shape, _input_type(checkpoint)


def write_pickle(obj: Any, path: str) -> None:
    """Pickle ``obj`` to ``path`` through a temporary file and a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_", suffix=".pkl")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(obj, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="extra_scripts/convert_vissl_to_detectron2.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("input", nargs="?", help="the vissl checkpoint or torchvision state dict")
    parser.add_argument("output", nargs="?", help="the .pkl file to write")
    parser.add_argument(
        "--state-dict-key",
        "--state_dict_key_name",
        dest="state_dict_key",
        default=None,
        help="where the model is (default: classy_state_dict if the file has it, else the "
        "file itself or its model_state_dict / state_dict / model entry; ema_model for the EMA "
        "weights of a vissl checkpoint)",
    )
    vissl = parser.add_argument_group("VISSL's flags")
    vissl.add_argument("--input_model_file", default=None, help="the input (instead of INPUT)")
    vissl.add_argument("--output_model", default=None, help="the output (instead of OUTPUT)")
    vissl.add_argument(
        "--weights_type",
        choices=("numpy", "torch"),
        default=None,
        help="not needed: tensors and numpy arrays are both read",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    source = args.input_model_file or args.input
    target = args.output_model or args.output
    if (args.input_model_file and args.input) or (args.output_model and args.output):
        raise ScriptError("give INPUT OUTPUT or --input_model_file/--output_model, not both.")
    if not source or not target:
        raise ScriptError("give the INPUT file and the .pkl OUTPUT file (see --help).")
    if not target.endswith(".pkl"):
        raise ScriptError(
            f"{target}: detectron2 reads a pickled dict of numpy arrays only from a file "
            "ending in .pkl; name the output *.pkl."
        )
    pkl, shape, input_type = convert(load_file(source), args.state_dict_key, source)
    write_pickle(pkl, target)
    print(
        f"wrote a detectron2 ResNet-{shape.depth} backbone ({len(pkl['model'])} arrays) to {target}"
    )
    print("detectron2 config for it (MODEL.WEIGHTS: the file):")
    print("\n".join(yaml_lines(detectron2_config(shape, input_type))))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

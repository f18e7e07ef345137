#!/usr/bin/env python3
"""Convert a DINO checkpoint's teacher (or student) to a file vissl's WEIGHTS_INIT loads.

Reads, recognised by their content:

- **facebookresearch/dino checkpoints**: the full training checkpoint
  (``dino_deitsmall16_pretrain_full_checkpoint.pth``: ``teacher`` and ``student`` state
  dicts with ``backbone.*`` and ``head.*`` names, the student's under ``module.``; ``args``)
  and the backbone-only files (``dino_deitsmall16_pretrain.pth``, ``dino_resnet50_pretrain.pth``:
  the backbone's own names). ViT backbones (``vit_tiny`` / ``vit_small`` / ``vit_base``,
  any patch size) become our ``vision_transformer`` trunk, whose names are DINO's; ResNet
  backbones (torchvision's names) our ``resnet`` trunk. DINO's head becomes our
  ``dino_head``: ``mlp.*`` keeps its indices, ``last_layer.weight_v`` is
  ``prototypes0.weight`` and ``last_layer.weight_g`` is ``prototypes0.scale`` (left out when
  all ones, DINO's ``norm_last_layer``).
- **vissl and VISSL DINO checkpoints**: the teacher kept in the loss state
  (``classy_state_dict.loss``: ours as ``teacher.*``, VISSL's as ``momentum_teacher.*``),
  as VISSL's script of this name extracts it; ``--model student`` takes the trained model
  instead.

The output is vissl's checkpoint layout (``classy_state_dict.base_model.model.{trunk,
heads}``): ``config.MODEL.WEIGHTS_INIT.PARAMS_FILE=OUT`` loads it with no other
WEIGHTS_INIT key. For DINO's own files the trunk (and head) are built from the weights'
shapes and loaded strictly before the file is written, and the overrides that build them
are printed; ``NUM_HEADS`` is not in the weights: it comes from ``args.arch`` of a full
checkpoint, else ``--num-heads``, else ``HIDDEN_DIM / 64`` (DINO's ViTs all have 64
channels per head). ``--trunk-only`` leaves the head out.

examples:
  python extra_scripts/convert_dino_checkpoint.py \\
      dino_deitsmall16_pretrain_full_checkpoint.pth dino_vits16_teacher.torch
  python extra_scripts/convert_dino_checkpoint.py dino_deitsmall16_pretrain.pth vits16.torch
  # VISSL's flags: the teacher of a vissl / VISSL DINO run
  python extra_scripts/convert_dino_checkpoint.py -i checkpoints/dino/model_final_checkpoint_phase99.torch \\
      -o dino_teacher.torch

Exit codes: 0 converted, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# the sibling scripts, also when this file is run by runpy (as the docs checks do)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import HelpFormatter, ScriptError, one_line, run_script
from _vissl_checkpoints import check_resnet_trunk, load_file, save, vissl_checkpoint

from vissl.errors import VisslError
from vissl.models.heads import get_model_head
from vissl.models.trunks import get_model_trunk
from vissl.utils.vissl_key_maps import FEATURE_BLOCKS, strip_wrappers

#: DINO's ViT architectures (``args.arch``) -> attention heads.
DINO_VIT_HEADS = {"vit_tiny": 3, "vit_small": 6, "vit_base": 12}
#: Where the teacher is in a vissl (ours) / VISSL DINO checkpoint's loss state.
TEACHER_PREFIXES = ("teacher.", "momentum_teacher.module.", "momentum_teacher.")
MODELS = ("teacher", "student")


@dataclass
class Converted:
    """The output file and what to print."""

    checkpoint: dict[str, Any]
    summary: str
    overrides: list[str]


# ---------------------------------------------------------------------- DINO's files
def _split_backbone_head(
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """DINO's MultiCropWrapper state (``backbone.*``, ``head.*``), or a bare backbone."""
    names = {strip_wrappers(str(k)): v for k, v in state.items()}
    if not any(k.startswith("backbone.") for k in names):
        return names, {}
    backbone = {k[len("backbone.") :]: v for k, v in names.items() if k.startswith("backbone.")}
    head = {k[len("head.") :]: v for k, v in names.items() if k.startswith("head.")}
    return backbone, head


def vit_settings(backbone: Mapping[str, torch.Tensor], num_heads: int) -> dict[str, Any]:
    """``config.MODEL.TRUNK.VISION_TRANSFORMERS`` of DINO ViT weights."""
    dim = int(backbone["cls_token"].shape[-1])
    patch = int(backbone["patch_embed.proj.weight"].shape[-1])
    grid = math.isqrt(int(backbone["pos_embed"].shape[1]) - 1)
    layers = 1 + max(int(m.group(1)) for k in backbone if (m := re.match(r"^blocks\.(\d+)\.", k)))
    return {
        "IMAGE_SIZE": grid * patch,
        "PATCH_SIZE": patch,
        "HIDDEN_DIM": dim,
        "NUM_LAYERS": layers,
        "NUM_HEADS": num_heads,
        "MLP_DIM": int(backbone["blocks.0.mlp.fc1.weight"].shape[0]),
        "QKV_BIAS": "blocks.0.attn.qkv.bias" in backbone,
    }


def dino_head(
    head: Mapping[str, torch.Tensor], what: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """DINO's head as our ``dino_head`` (head 0): ``(state, its HEAD.PARAMS arguments)``."""
    names = dict(head)
    if "mlp.weight" in names:  # DINO's nlayers=1 head is a bare Linear
        names = {
            ("mlp.0." + k[len("mlp.") :] if k.startswith("mlp.") else k): v
            for k, v in names.items()
        }
    g = names.pop(
        "last_layer.weight_g", names.pop("last_layer.parametrizations.weight.original0", None)
    )
    v = names.pop(
        "last_layer.weight_v", names.pop("last_layer.parametrizations.weight.original1", None)
    )
    if v is None:
        raise ScriptError(
            f"{what}: DINO's head has no last_layer.weight_v (keys {sorted(head)[:5]})."
        )
    linears = sorted(
        int(m.group(1))
        for k, t in names.items()
        if (m := re.match(r"^mlp\.(\d+)\.weight$", k)) and t.ndim == 2
    )
    use_bn = any(k.endswith("running_mean") for k in names)
    normalize = g is None or bool(torch.all(g == 1))
    out = {f"0.{k}": t for k, t in names.items()}
    out["0.prototypes0.weight"] = v
    if not normalize:
        assert g is not None
        out["0.prototypes0.scale"] = g.reshape(-1, 1)
    first, last = names[f"mlp.{linears[0]}.weight"], names[f"mlp.{linears[-1]}.weight"]
    params = {
        "in_dim": int(first.shape[1]),
        "num_clusters": [int(v.shape[0])],
        "use_bn": use_bn,
        "normalize_last_layer": normalize,
        "num_layers": len(linears),
        "hidden_dim": int(first.shape[0]) if len(linears) > 1 else 2048,
        "bottleneck_dim": int(last.shape[0]),
    }
    return out, params


def _num_heads(args: Any, given: int | None, dim: int, what: str) -> int:
    arch = getattr(args, "arch", None)
    if given is not None:
        return given
    if arch in DINO_VIT_HEADS:
        return DINO_VIT_HEADS[arch]
    if dim % 64:
        raise ScriptError(f"{what}: give --num-heads (the ViT's width {dim} is no multiple of 64).")
    return dim // 64


def _check_vit(settings: Mapping[str, Any], trunk: Mapping[str, torch.Tensor], what: str) -> None:
    try:
        model = get_model_trunk("vision_transformer")(
            {"INPUT_TYPE": "rgb", "TRUNK": {"VISION_TRANSFORMERS": dict(settings)}},
            "vision_transformer",
        )
        model.load_state_dict(dict(trunk), strict=True)
    except (RuntimeError, VisslError) as err:
        raise ScriptError(
            f"{what} does not fit our vision_transformer trunk: {one_line(err)}"
        ) from err


def _check_head(params: Mapping[str, Any], head: Mapping[str, torch.Tensor], what: str) -> None:
    state = {k[len("0.") :]: v for k, v in head.items()}
    try:
        module = get_model_head("dino_head")({}, **params)
        module.load_state_dict(state, strict=True)
    except (RuntimeError, VisslError) as err:
        raise ScriptError(
            f"{what}: DINO's head does not fit our dino_head: {one_line(err)}"
        ) from err


def _overrides_text(name: str, values: Mapping[str, Any]) -> str:
    def fmt(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, list):
            return "[" + ",".join(fmt(v) for v in value) + "]"
        return str(value)

    return f"[[{name},{{" + ",".join(f"{k}:{fmt(v)}" for k, v in values.items()) + "}]]"


def convert_dino(
    loaded: Mapping[str, Any], model: str, num_heads: int | None, trunk_only: bool, what: str
) -> Converted:
    """A facebookresearch/dino checkpoint (full or backbone only) in vissl's layout."""
    full = "teacher" in loaded or "student" in loaded
    if full:
        if model not in loaded:
            raise ScriptError(
                f"{what} has no {model!r} (its keys: {sorted(map(str, loaded))[:8]})."
            )
        state = loaded[model]
    else:
        state = loaded
    if not isinstance(state, Mapping) or not all(
        isinstance(t, torch.Tensor) for t in state.values()
    ):
        raise ScriptError(f"{what}: the {model} is not a state dict of tensors.")
    backbone, head = _split_backbone_head(state)
    overrides: list[str] = []
    if "cls_token" in backbone:
        dim = int(backbone["cls_token"].shape[-1])
        settings = vit_settings(backbone, _num_heads(loaded.get("args"), num_heads, dim, what))
        trunk = {k: v for k, v in backbone.items() if not k.startswith("head.")}
        _check_vit(settings, trunk, what)
        overrides.append("config.MODEL.TRUNK.NAME=vision_transformer")
        overrides += [
            f"config.MODEL.TRUNK.VISION_TRANSFORMERS.{k}={v}" for k, v in settings.items()
        ]
        kind = f"ViT ({settings['NUM_LAYERS']} blocks, width {dim}, patch {settings['PATCH_SIZE']})"
    elif "conv1.weight" in backbone and any(k.startswith("layer1.") for k in backbone):
        trunk = {FEATURE_BLOCKS + k: v for k, v in backbone.items() if not k.startswith("fc.")}
        shape = check_resnet_trunk(trunk, what)
        overrides += shape.overrides()
        kind = f"ResNet-{shape.depth}"
    else:
        raise ScriptError(
            f"{what}: the {model}'s backbone is neither a DINO ViT (cls_token) nor a ResNet "
            f"(conv1, layer1); its keys look like {sorted(backbone)[:3]}."
        )
    heads: dict[str, torch.Tensor] = {}
    summary = f"the DINO {model if full else 'backbone'}'s {kind} trunk"
    if head and not trunk_only:
        heads, params = dino_head(head, what)
        _check_head(params, heads, what)
        overrides.append(f"'config.MODEL.HEAD.PARAMS={_overrides_text('dino_head', params)}'")
        summary += " and head (dino_head)"
    return Converted(vissl_checkpoint(trunk, heads), summary, overrides)


# ---------------------------------------------------------------------- vissl / VISSL files
def convert_vissl(loaded: Mapping[str, Any], model: str, trunk_only: bool, what: str) -> Converted:
    """The teacher (or the student) of a vissl or VISSL DINO checkpoint."""
    classy = loaded["classy_state_dict"]
    if model == "student":
        base = classy.get("base_model", {}).get("model", {})
        trunk, heads = dict(base.get("trunk") or {}), dict(base.get("heads") or {})
    else:
        loss = classy.get("loss") or {}
        prefix = next(
            (p for p in TEACHER_PREFIXES if any(str(k).startswith(p) for k in loss)), None
        )
        if prefix is None:
            raise ScriptError(
                f"{what} holds no DINO teacher: its loss state has no teacher.* (vissl) or "
                "momentum_teacher.* (VISSL) weights. Is it a DINO run's checkpoint?"
            )
        teacher = {str(k)[len(prefix) :]: v for k, v in loss.items() if str(k).startswith(prefix)}
        trunk = {k[len("trunk.") :]: v for k, v in teacher.items() if k.startswith("trunk.")}
        heads = {k[len("heads.") :]: v for k, v in teacher.items() if k.startswith("heads.")}
    if not trunk:
        raise ScriptError(f"{what}: the {model} has no trunk weights.")
    trunk = {strip_wrappers(k): v for k, v in trunk.items()}
    heads = {} if trunk_only else {strip_wrappers(k): v for k, v in heads.items()}
    summary = f"the {model}'s trunk" + (" and heads" if heads else "")
    return Converted(vissl_checkpoint(trunk, heads), summary, [])


# ---------------------------------------------------------------------- command line
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="extra_scripts/convert_dino_checkpoint.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("input", nargs="?", help="the DINO checkpoint")
    parser.add_argument("output", nargs="?", help="the file to write")
    parser.add_argument(
        "-i", "--input", dest="input_flag", default=None, help="VISSL's flag for INPUT"
    )
    parser.add_argument(
        "-o", "--output", dest="output_flag", default=None, help="VISSL's flag for OUTPUT"
    )
    parser.add_argument(
        "--model",
        choices=MODELS,
        default="teacher",
        help="which network to convert (DINO evaluates the teacher)",
    )
    parser.add_argument("--num-heads", type=int, default=None, help="attention heads of a DINO ViT")
    parser.add_argument("--trunk-only", action="store_true", help="leave the head out")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if (args.input_flag and args.input) or (args.output_flag and args.output):
        raise ScriptError("give INPUT OUTPUT or -i/-o, not both.")
    source, target = args.input_flag or args.input, args.output_flag or args.output
    if not source or not target:
        raise ScriptError("give the INPUT file and the OUTPUT file (see --help).")
    if args.num_heads is not None and args.num_heads <= 0:
        raise ScriptError(f"--num-heads {args.num_heads}: give a positive number.")
    loaded = load_file(source, namespaces=True)
    if isinstance(loaded.get("classy_state_dict"), Mapping):
        result = convert_vissl(loaded, args.model, args.trunk_only, source)
    else:
        result = convert_dino(loaded, args.model, args.num_heads, args.trunk_only, source)
    save(result.checkpoint, target)
    print(f"wrote {result.summary} to {target}")
    if result.overrides:
        print("use it with:")
        print(
            "  " + " ".join([*result.overrides, f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={target}"])
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

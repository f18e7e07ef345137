#!/usr/bin/env python3
"""Convert a vissl ResNet trunk to a torchvision ResNet state dict, and back.

vissl -> torchvision (the default): the trunk of a vissl (or VISSL) checkpoint becomes a
plain state dict of ``torchvision.models.resnet*``, keys ``conv1.weight``, ``bn1.*``,
``layer1.0.conv1.weight``, ... The architecture is read from the weights (depth, block,
groups, stem) and checked against the config saved in the checkpoint; the script loads
the result into the matching torchvision model (strict) before writing it, and prints the
few lines that build that model. The file holds the trunk only, so the model's ``fc`` is
set to ``nn.Identity()`` and ``model(x)`` is the trunk's feature (vissl's ``flatten``
output); ``--head-as-fc`` writes a one-linear-layer head (``mlp`` with dims
``[features, classes]``, e.g. a supervised run's) as ``fc`` instead.

A trunk with the small-image stem (``RESNETS.SMALL_IMAGE_STEM: True``, as quick_start)
has a 3x3 stride-1 ``conv1`` and no max-pool; the printed code builds torchvision's model
with ``model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)`` and
``model.maxpool = nn.Identity()``. Only what torchvision's ResNet can express converts:
WIDTH_MULTIPLIER 1 (quick_start's 0.5 does not), BatchNorm, LAYER4_STRIDE 2, no weight
standardisation, RGB (or BGR, folded into ``conv1``) input.

torchvision -> vissl (``--reverse``): a torchvision ResNet state dict (``resnet18`` ...
``resnet152``, ResNeXt, wide ResNet; ``module.`` prefixes are removed) becomes a file in
vissl's checkpoint layout (``classy_state_dict.base_model.model.trunk``) that
``config.MODEL.WEIGHTS_INIT.PARAMS_FILE`` loads with its default STATE_DICT_KEY_NAME and
no prefix settings; the trunk overrides to use with it are printed. ``fc`` is dropped, or
written as head 0 (``mlp`` with dims ``[features, classes]``) with ``--fc-as-head``. A
3x3 ``conv1`` is read as vissl's small-image stem (3x3 stride-1 conv, no max-pool).

examples:
  # a full-width ResNet's checkpoint (quick_start's trunk is half-width; docs/extra_scripts.md
  # trains quick_start with config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=1)
  python extra_scripts/convert_vissl_to_torchvision.py \\
      checkpoints/my_run/model_final_checkpoint_phase29.torch resnet18_trunk.pth
  python extra_scripts/convert_vissl_to_torchvision.py --reverse \\
      resnet50_torchvision.pth resnet50_vissl.torch
  # VISSL's flags work too (writes D/N.torch)
  python extra_scripts/convert_vissl_to_torchvision.py \\
      --model_url_or_file model_final_checkpoint_phase29.torch --output_dir D --output_name N

Exit codes: 0 converted, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import yaml

# the sibling scripts, also when this file is run by runpy (as the docs checks do)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import HelpFormatter, ScriptError, one_line, run_script
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

from vissl.errors import VisslError
from vissl.models.trunks.resnext import BLOCK_CONFIG
from vissl.utils.checkpoint import atomic_torch_save, load_checkpoint
from vissl.utils.weights_init import extract_state_dict

#: vissl trunk key prefix of the ResNet layers (VISSL's name).
FEATURE_BLOCKS = "_feature_blocks."
#: Where a linear-evaluation (feature extractor) trunk keeps the pretraining trunk.
FEATURE_EXTRACTOR = "base_model."
#: The keys of a head that is one linear layer (``mlp`` with two dims), in vissl's heads.
LINEAR_HEAD_KEYS = ("0.clf.0.weight", "0.clf.0.bias")

#: (depth, groups, width_per_group) -> torchvision builder of that architecture.
TORCHVISION_BUILDERS: dict[tuple[int, int, int], str] = {
    (18, 1, 64): "resnet18",
    (34, 1, 64): "resnet34",
    (50, 1, 64): "resnet50",
    (101, 1, 64): "resnet101",
    (152, 1, 64): "resnet152",
    (50, 32, 4): "resnext50_32x4d",
    (101, 32, 8): "resnext101_32x8d",
    (101, 64, 4): "resnext101_64x4d",
    (50, 1, 128): "wide_resnet50_2",
    (101, 1, 128): "wide_resnet101_2",
}


@dataclass(frozen=True)
class ResNetArch:
    """The ResNet a set of weights belongs to, in vissl's and torchvision's terms."""

    depth: int
    bottleneck: bool
    layers: tuple[int, int, int, int]
    groups: int = 1
    width_per_group: int = 64
    small_image_stem: bool = False

    @property
    def feature_dim(self) -> int:
        """Width of the pooled trunk feature (torchvision's ``fc.in_features``)."""
        return 512 * (Bottleneck.expansion if self.bottleneck else BasicBlock.expansion)

    @property
    def builder(self) -> str | None:
        """The ``torchvision.models`` function building this architecture, if one does."""
        return TORCHVISION_BUILDERS.get((self.depth, self.groups, self.width_per_group))

    def vissl_overrides(self) -> list[str]:
        """The ``config.MODEL.TRUNK`` overrides of a vissl trunk with this architecture."""
        key = "config.MODEL.TRUNK.RESNETS"
        out = [
            "config.MODEL.TRUNK.NAME=resnet",
            f"{key}.DEPTH={self.depth}",
            f"{key}.WIDTH_MULTIPLIER=1",
            f"{key}.SMALL_IMAGE_STEM={self.small_image_stem}",
        ]
        if self.groups != 1 or self.width_per_group != 64:
            out += [f"{key}.GROUPS={self.groups}", f"{key}.WIDTH_PER_GROUP={self.width_per_group}"]
        return out


# ---------------------------------------------------------------------- architecture
def _block_count(state: Mapping[str, torch.Tensor], layer: int) -> int:
    pattern = re.compile(rf"^layer{layer}\.(\d+)\.")
    found = {int(m.group(1)) for k in state if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def infer_arch(state: Mapping[str, torch.Tensor], what: str) -> ResNetArch:
    """The architecture of ResNet weights named as torchvision names them (``conv1.weight``).

    Args:
        state: the weights, torchvision key names (a vissl trunk without its prefix).
        what: how to name the weights in messages.

    Raises:
        ScriptError: the weights are not a ResNet that torchvision's ResNet class builds.
    """
    conv1 = state.get("conv1.weight")
    if conv1 is None or "layer1.0.conv1.weight" not in state:
        raise ScriptError(
            f"{what} are not ResNet weights: no conv1.weight / layer1.0.conv1.weight "
            f"(first keys: {list(state)[:5]})."
        )
    width, in_channels, kh, kw = (int(s) for s in conv1.shape)
    if (kh, kw) not in ((3, 3), (7, 7)):
        raise ScriptError(f"{what}: conv1 is {kh}x{kw}; a ResNet stem conv is 7x7 (or 3x3).")
    if in_channels != 3:
        raise ScriptError(
            f"{what}: conv1 takes {in_channels} input channel(s); torchvision's ResNet "
            "takes 3 (RGB). MODEL.INPUT_TYPE lab trunks do not convert."
        )
    if width != 64:
        raise ScriptError(
            f"{what}: the stem has {width} channels (RESNETS.WIDTH_MULTIPLIER "
            f"{width / 64:g}); torchvision's ResNet is built at width 64 only. Convert a "
            "trunk trained with config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=1."
        )
    if "bn1.running_mean" not in state:
        raise ScriptError(
            f"{what}: the norm layers have no running statistics, so they are not "
            "BatchNorm (RESNETS.NORM GroupNorm or LayerNorm); torchvision's ResNet uses "
            "BatchNorm."
        )
    bottleneck = "layer1.0.conv3.weight" in state
    counts = [_block_count(state, i) for i in (1, 2, 3, 4)]
    layers = (counts[0], counts[1], counts[2], counts[3])
    block = Bottleneck if bottleneck else BasicBlock
    depth = next((d for d, (b, ls) in BLOCK_CONFIG.items() if b is block and ls == layers), None)
    if depth is None:
        raise ScriptError(
            f"{what}: {block.__name__} stages of {list(layers)} blocks are no ResNet depth "
            f"vissl builds ({sorted(BLOCK_CONFIG)})."
        )
    groups, width_per_group = 1, 64
    if bottleneck:
        inner, per_group = (int(s) for s in state["layer1.0.conv2.weight"].shape[:2])
        groups = inner // per_group
        width_per_group = inner // groups
    return ResNetArch(
        depth=depth,
        bottleneck=bottleneck,
        layers=layers,
        groups=groups,
        width_per_group=width_per_group,
        small_image_stem=kh == 3,
    )


def build_torchvision_resnet(arch: ResNetArch, num_classes: int | None = None) -> ResNet:
    """torchvision's ResNet of ``arch``: small-image stem if any; ``fc`` an identity when
    ``num_classes`` is None (the state dict holds the trunk only)."""
    model = ResNet(
        Bottleneck if arch.bottleneck else BasicBlock,
        list(arch.layers),
        num_classes=num_classes or 1000,
        groups=arch.groups,
        width_per_group=arch.width_per_group,
    )
    if arch.small_image_stem:
        model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()  # type: ignore[assignment]
    if num_classes is None:
        model.fc = nn.Identity()  # type: ignore[assignment]
    return model


def torchvision_code(arch: ResNetArch, path: str, num_classes: int | None) -> str:
    """The Python lines that build torchvision's model of ``arch`` and load ``path``."""
    args = f"num_classes={num_classes}" if num_classes is not None else ""
    if arch.builder:
        build = f"model = torchvision.models.{arch.builder}({args})"
    else:
        block = "Bottleneck" if arch.bottleneck else "BasicBlock"
        extra = f", {args}" if args else ""
        build = (
            f"model = torchvision.models.resnet.ResNet(torchvision.models.resnet.{block}, "
            f"{list(arch.layers)}, groups={arch.groups}, "
            f"width_per_group={arch.width_per_group}{extra})"
        )
    lines = ["import torch", "import torchvision", "from torch import nn", "", build]
    if arch.small_image_stem:
        lines += [
            "# vissl's small-image stem (RESNETS.SMALL_IMAGE_STEM): 3x3 stride-1 conv, no max-pool",
            "model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)",
            "model.maxpool = nn.Identity()",
        ]
    if num_classes is None:
        lines.append(
            f"model.fc = nn.Identity()  # trunk only: model(x) is the {arch.feature_dim}-d feature"
        )
    lines += [f"model.load_state_dict(torch.load({path!r}, weights_only=True))", "model.eval()"]
    return "\n".join(lines)


# ---------------------------------------------------------------------- vissl -> torchvision
def _model_config(checkpoint: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """config.MODEL saved in one of our checkpoints (VISSL's own have none)."""
    text = checkpoint.get("config")
    if not isinstance(text, str):
        return None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    model = config.get("config", {}).get("MODEL") if isinstance(config, dict) else None
    return model if isinstance(model, Mapping) else None


def _looks_like_torchvision(state: Mapping[str, Any]) -> bool:
    keys = {k[len("module.") :] if k.startswith("module.") else k for k in map(str, state)}
    return "conv1.weight" in keys and "layer1.0.conv1.weight" in keys


def _check_trunk_config(model_config: Mapping[str, Any], arch: ResNetArch, what: str) -> str:
    """Check the saved trunk config converts; return its MODEL.INPUT_TYPE."""
    resnets = (model_config.get("TRUNK") or {}).get("RESNETS") or {}
    problems = []
    if resnets.get("LAYER4_STRIDE", 2) != 2:
        problems.append(
            f"RESNETS.LAYER4_STRIDE {resnets['LAYER4_STRIDE']} (torchvision's layer4 has stride 2)"
        )
    if resnets.get("STANDARDIZE_CONVOLUTIONS", False):
        problems.append("RESNETS.STANDARDIZE_CONVOLUTIONS (torchvision's convs are plain)")
    if resnets.get("NORM", "BatchNorm") != "BatchNorm":
        problems.append(f"RESNETS.NORM {resnets['NORM']} (torchvision's ResNet uses BatchNorm)")
    if "DEPTH" in resnets and resnets["DEPTH"] != arch.depth:
        problems.append(f"RESNETS.DEPTH {resnets['DEPTH']} but the weights are a {arch.depth}")
    input_type = str(model_config.get("INPUT_TYPE", "rgb") or "rgb")
    if input_type not in ("rgb", "bgr"):
        problems.append(f"MODEL.INPUT_TYPE {input_type} (torchvision's ResNet takes RGB)")
    if problems:
        raise ScriptError(
            f"{what} does not convert to torchvision's ResNet: {'; '.join(problems)}."
        )
    return input_type


def vissl_to_torchvision(
    checkpoint: Mapping[str, Any],
    state_dict_key: str = "classy_state_dict",
    head_as_fc: bool = False,
    what: str = "the checkpoint",
) -> tuple[OrderedDict[str, torch.Tensor], ResNetArch, int | None]:
    """The torchvision state dict of a vissl checkpoint's ResNet trunk.

    Args:
        checkpoint: a loaded vissl or VISSL checkpoint.
        state_dict_key: where the model is, as MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME
            (``classy_state_dict``, or ``ema_model`` for the EMA weights).
        head_as_fc: write head 0, which must be one linear layer, as ``fc``.
        what: how to name the checkpoint in messages.

    Returns:
        ``(state dict, architecture, number of classes of fc or None)``; the state dict
        loads strictly into ``build_torchvision_resnet(arch, num_classes)``.

    Raises:
        ScriptError: not a vissl checkpoint, no trunk, or a trunk torchvision cannot build.
    """
    if state_dict_key == "classy_state_dict" and "classy_state_dict" not in checkpoint:
        if _looks_like_torchvision(checkpoint):
            raise ScriptError(
                f"{what} is a torchvision ResNet state dict, not a vissl checkpoint; "
                "add --reverse to convert it to vissl."
            )
        raise ScriptError(
            f"{what} is not a vissl checkpoint: it has no 'classy_state_dict' (its keys: "
            f"{sorted(map(str, checkpoint))[:8]}). Give a model_*.torch file of a vissl "
            "CHECKPOINT.DIR, or --state-dict-key where the model is."
        )
    try:
        flat, is_vissl = extract_state_dict(checkpoint, state_dict_key)
    except VisslError as err:
        raise ScriptError(f"{what}: {one_line(err)}") from err
    if not is_vissl:
        raise ScriptError(
            f"{what}: the weights under {state_dict_key!r} are not a vissl model "
            "(base_model.model.trunk / heads)."
        )
    trunk = {k[len("trunk.") :]: v for k, v in flat.items() if k.startswith("trunk.")}
    heads = {k[len("heads.") :]: v for k, v in flat.items() if k.startswith("heads.")}
    if trunk and all(k.startswith(FEATURE_EXTRACTOR) for k in trunk):
        trunk = {k[len(FEATURE_EXTRACTOR) :]: v for k, v in trunk.items()}
    model_config = _model_config(checkpoint)
    trunk_name = ((model_config or {}).get("TRUNK") or {}).get("NAME")
    if trunk_name is not None and trunk_name != "resnet":
        raise ScriptError(
            f"{what} has a {trunk_name!r} trunk (config.MODEL.TRUNK.NAME); only the "
            "'resnet' trunk converts to torchvision's ResNet."
        )
    if not trunk:
        raise ScriptError(f"{what} holds no trunk weights (no trunk.* keys in the model).")
    if not all(k.startswith(FEATURE_BLOCKS) for k in trunk):
        odd = [k for k in trunk if not k.startswith(FEATURE_BLOCKS)][:5]
        raise ScriptError(
            f"{what}: the trunk is not vissl's ResNet (keys such as {odd} are not under "
            f"{FEATURE_BLOCKS!r}); only the 'resnet' trunk converts to torchvision's ResNet."
        )
    state = OrderedDict((k[len(FEATURE_BLOCKS) :], v) for k, v in trunk.items())
    arch = infer_arch(state, f"{what}'s trunk")
    if model_config is not None:
        input_type = _check_trunk_config(model_config, arch, what)
    else:
        input_type = "rgb"
        print(
            f"warning: {what} has no saved config (a VISSL checkpoint?): assuming RGB input, "
            "LAYER4_STRIDE 2 and no weight standardisation.",
            file=sys.stderr,
        )
    if input_type == "bgr":
        # vissl's trunk flips RGB input to BGR before conv1; fold the flip into conv1 so
        # the torchvision model takes the same RGB input.
        state["conv1.weight"] = state["conv1.weight"][:, [2, 1, 0]].contiguous()
    num_classes = None
    if head_as_fc:
        if set(heads) != set(LINEAR_HEAD_KEYS):
            raise ScriptError(
                f"--head-as-fc needs a head that is one linear layer on the trunk feature "
                f"(mlp with dims [{arch.feature_dim}, classes]); {what}'s heads hold "
                f"{sorted(heads)[:8] or 'nothing'}."
            )
        weight, bias = heads[LINEAR_HEAD_KEYS[0]], heads[LINEAR_HEAD_KEYS[1]]
        if weight.ndim != 2 or weight.shape[1] != arch.feature_dim:
            raise ScriptError(
                f"--head-as-fc: head 0 maps {tuple(weight.shape)[::-1]} but the trunk "
                f"feature has {arch.feature_dim} values."
            )
        state["fc.weight"], state["fc.bias"] = weight, bias
        num_classes = int(weight.shape[0])
    _load_strict(arch, num_classes, state, what)
    return state, arch, num_classes


def _load_strict(
    arch: ResNetArch, num_classes: int | None, state: Mapping[str, torch.Tensor], what: str
) -> None:
    """Load ``state`` into torchvision's model of ``arch`` (strict): proves it fits."""
    model = build_torchvision_resnet(arch, num_classes)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ScriptError(
            f"{what} does not fit torchvision's {arch.builder or 'ResNet'}: {one_line(err)}"
        ) from err


# ---------------------------------------------------------------------- torchvision -> vissl
def _find_torchvision_state(
    loaded: Mapping[str, Any], state_dict_key: str | None, what: str
) -> dict[str, torch.Tensor]:
    state: Any = loaded
    if state_dict_key:
        if state_dict_key not in loaded:
            raise ScriptError(
                f"{what} has no {state_dict_key!r} (its keys: {sorted(map(str, loaded))[:8]})."
            )
        state = loaded[state_dict_key]
    elif "classy_state_dict" in loaded:
        raise ScriptError(f"{what} is a vissl checkpoint; leave out --reverse to convert it.")
    elif not _looks_like_torchvision(loaded):
        for key in ("state_dict", "model"):  # common wrappers of a state dict
            inner = loaded.get(key)
            if isinstance(inner, Mapping) and _looks_like_torchvision(inner):
                state = inner
                break
    if not isinstance(state, Mapping):
        raise ScriptError(f"{what} holds a {type(state).__name__}, not a state dict.")
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ScriptError(
                f"{what} is not a state dict of tensors ({name!r} is a {type(value).__name__}); "
                "give --state-dict-key where the state dict is."
            )
        name = str(name)
        out[name[len("module.") :] if name.startswith("module.") else name] = value
    return out


def torchvision_to_vissl(
    loaded: Mapping[str, Any],
    state_dict_key: str | None = None,
    fc_as_head: bool = False,
    what: str = "the file",
) -> tuple[dict[str, Any], ResNetArch]:
    """A file in vissl's checkpoint layout from a torchvision ResNet state dict.

    Args:
        loaded: the loaded torchvision file (a state dict, or a dict holding one under
            ``state_dict`` / ``model`` / ``state_dict_key``).
        state_dict_key: the key of the state dict inside ``loaded``, if any.
        fc_as_head: keep ``fc`` as head 0 (an ``mlp`` with dims ``[features, classes]``).
        what: how to name the file in messages.

    Returns:
        ``(checkpoint, architecture)``; the checkpoint has
        ``classy_state_dict.base_model.model.{trunk, heads}`` as vissl writes it.

    Raises:
        ScriptError: not a torchvision ResNet state dict.
    """
    state = _find_torchvision_state(loaded, state_dict_key, what)
    fc = {k: v for k, v in state.items() if k.startswith("fc.")}
    trunk = OrderedDict((k, v) for k, v in state.items() if not k.startswith("fc."))
    arch = infer_arch(trunk, what)
    num_classes = None
    if fc:
        if set(fc) != {"fc.weight", "fc.bias"} or fc["fc.weight"].ndim != 2:
            raise ScriptError(f"{what}: fc is not one linear layer ({sorted(fc)}).")
        num_classes = int(fc["fc.weight"].shape[0])
    _load_strict(arch, num_classes, state, what)
    heads: dict[str, torch.Tensor] = {}
    if fc_as_head:
        if not fc:
            raise ScriptError(f"--fc-as-head: {what} has no fc layer.")
        heads = {LINEAR_HEAD_KEYS[0]: fc["fc.weight"], LINEAR_HEAD_KEYS[1]: fc["fc.bias"]}
    model = {
        "trunk": {FEATURE_BLOCKS + k: v for k, v in trunk.items()},
        "heads": heads,
        "other": {},
    }
    return {"classy_state_dict": {"base_model": {"model": model, "meta": {}}}}, arch


# ---------------------------------------------------------------------- command line
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="extra_scripts/convert_vissl_to_torchvision.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "input", nargs="?", help="the vissl checkpoint (with --reverse: the torchvision state dict)"
    )
    parser.add_argument("output", nargs="?", help="the file to write")
    parser.add_argument(
        "--reverse",
        action="store_true",
        help="convert a torchvision ResNet state dict to a vissl WEIGHTS_INIT file",
    )
    parser.add_argument(
        "--state-dict-key",
        default=None,
        help="where the weights are in the input: as MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME "
        "for a vissl checkpoint (default classy_state_dict; ema_model for the EMA weights); "
        "for --reverse, the key of the state dict (default: the file itself, or its "
        "'state_dict' / 'model' entry)",
    )
    parser.add_argument(
        "--head-as-fc",
        action="store_true",
        help="vissl -> torchvision: write head 0 (one linear layer) as fc",
    )
    parser.add_argument(
        "--fc-as-head",
        action="store_true",
        help="--reverse: keep fc as head 0 (mlp with dims [features, classes])",
    )
    vissl = parser.add_argument_group("VISSL's flags (instead of input and output)")
    vissl.add_argument("--model_url_or_file", default=None, help="the input (a local file)")
    vissl.add_argument("--output_dir", default=None, help="folder of the output")
    vissl.add_argument("--output_name", default=None, help="the output is OUTPUT_DIR/NAME.torch")
    return parser


def _paths(args: argparse.Namespace) -> tuple[str, str]:
    vissl_flags = [args.model_url_or_file, args.output_dir, args.output_name]
    if any(f is not None for f in vissl_flags):
        if args.input is not None or args.output is not None:
            raise ScriptError(
                "give either INPUT OUTPUT or --model_url_or_file/--output_dir/--output_name, "
                "not both."
            )
        if any(f is None for f in vissl_flags):
            raise ScriptError("--model_url_or_file, --output_dir and --output_name go together.")
        if "://" in args.model_url_or_file:
            raise ScriptError(
                f"--model_url_or_file {args.model_url_or_file!r}: only local files are read; "
                "download it first."
            )
        return args.model_url_or_file, os.path.join(args.output_dir, f"{args.output_name}.torch")
    if args.input is None or args.output is None:
        raise ScriptError("give the INPUT file and the OUTPUT file (see --help).")
    return args.input, args.output


def _load(path: str) -> Mapping[str, Any]:
    if not os.path.isfile(path):
        raise ScriptError(f"{path} does not exist.")
    try:
        loaded = load_checkpoint(path)
    except VisslError as err:
        raise ScriptError(
            f"{path} is not a checkpoint or state dict that loads safely: {one_line(err)}"
        ) from err
    if not isinstance(loaded, Mapping):
        raise ScriptError(f"{path} holds a {type(loaded).__name__}, not a dict of weights.")
    return loaded


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    source, target = _paths(args)
    if args.reverse and args.head_as_fc:
        raise ScriptError(
            "--head-as-fc is for vissl -> torchvision; use --fc-as-head with --reverse."
        )
    if not args.reverse and args.fc_as_head:
        raise ScriptError("--fc-as-head is for --reverse; use --head-as-fc without it.")
    loaded = _load(source)
    if args.reverse:
        checkpoint, arch = torchvision_to_vissl(
            loaded, args.state_dict_key, args.fc_as_head, what=source
        )
        atomic_torch_save(checkpoint, target)
        head = " and fc as head 0" if args.fc_as_head else ""
        print(f"wrote the vissl {arch.builder or 'ResNet'} trunk{head} to {target}")
        print("use it with:")
        print(
            "  "
            + " ".join([*arch.vissl_overrides(), f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={target}"])
        )
        return 0
    state, arch, num_classes = vissl_to_torchvision(
        loaded, args.state_dict_key or "classy_state_dict", args.head_as_fc, what=source
    )
    atomic_torch_save(state, target)
    print(
        f"wrote torchvision {arch.builder or 'ResNet'} weights ({len(state)} tensors) to {target}"
    )
    print("load them with:")
    print(torchvision_code(arch, target, num_classes))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

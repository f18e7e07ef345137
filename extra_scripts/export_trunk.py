#!/usr/bin/env python3
"""Export the trunk of a vissl checkpoint as a torchvision, timm or safetensors state dict.

The trunk's weights are written with the key names of the library they fit:

- ``--format torchvision``: vissl's ``resnet`` trunk as torchvision's ResNet
  (``conv1.weight``, ``layer1.0.bn1.bias``, ...; no ``fc``), through the checks of
  ``convert_vissl_to_torchvision.py`` (which also folds BGR input into ``conv1``). A
  full-width trunk loads strictly into ``torchvision.models.resnet*`` (the script prints
  how, with the small-image stem's conv1 and max-pool replaced where the trunk has it); a
  trunk of another width (quick_start's WIDTH_MULTIPLIER 0.5) keeps torchvision's names,
  but neither torchvision nor timm builds a ResNet of that width: the script prints the
  Python lines that build vissl's trunk of the checkpoint's ``config.MODEL.TRUNK`` and
  load the file into it (or use ``MODEL.WEIGHTS_INIT``). A ``timm`` trunk whose model is a timm ResNet converts too
  (timm's ResNet names are torchvision's).
- ``--format timm``: a ``timm`` trunk as its timm model's state dict (loads into
  ``timm.create_model(MODEL_NAME, num_classes=0, **KWARGS)``, checked when timm is
  installed and the checkpoint has its config); a ``resnet`` trunk with the names of
  timm's ResNet, which are torchvision's.
- ``--format safetensors``: the same tensors and names as above (torchvision's for a
  ``resnet`` trunk, timm's for a ``timm`` trunk) in a ``.safetensors`` file, whose
  metadata records ``format``, ``vissl_trunk`` and, for timm, ``timm_model_name``.

Every output loads back into the same vissl trunk with
``config.MODEL.WEIGHTS_INIT.PARAMS_FILE=OUT`` and no other WEIGHTS_INIT key
(vissl/utils/external_weights.py maps the names).

examples:
  python extra_scripts/export_trunk.py \\
      checkpoints/quick_start/model_final_checkpoint_phase29.torch trunk.pth --format torchvision
  python extra_scripts/export_trunk.py CKPT trunk.safetensors --format safetensors
  python extra_scripts/export_trunk.py CKPT ema_trunk.pth --format timm --state-dict-key ema_model

Exit codes: 0 exported, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import torch

# the sibling scripts, also when this file is run by runpy (as the docs checks do)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import HelpFormatter, ScriptError, one_line, run_script
from convert_vissl_to_torchvision import (
    _model_config,
    build_torchvision_resnet,
    infer_arch,
    torchvision_code,
    vissl_to_torchvision,
)

from vissl.errors import VisslError
from vissl.utils.checkpoint import atomic_torch_save, load_checkpoint
from vissl.utils.external_weights import save_safetensors, trunk_to_external
from vissl.utils.weights_init import extract_state_dict

FORMATS = ("torchvision", "timm", "safetensors")


def trunk_state(
    checkpoint: Mapping[str, Any], state_dict_key: str, what: str
) -> tuple[str, dict[str, torch.Tensor]]:
    """``(trunk name, the trunk's state dict in its library's names)`` of a checkpoint.

    Raises:
        ScriptError: not a vissl checkpoint, no trunk, or a trunk with no external names.
    """
    if state_dict_key == "classy_state_dict" and "classy_state_dict" not in checkpoint:
        raise ScriptError(
            f"{what} is not a vissl checkpoint: it has no 'classy_state_dict' (its keys: "
            f"{sorted(map(str, checkpoint))[:8]}). Give a model_*.torch file of a vissl "
            "CHECKPOINT.DIR, or --state-dict-key where the model is."
        )
    try:
        flat, is_vissl = extract_state_dict(checkpoint, state_dict_key)
        if not is_vissl:
            raise ScriptError(
                f"{what}: the weights under {state_dict_key!r} are not a vissl model "
                "(base_model.model.trunk / heads)."
            )
        trunk = {k[len("trunk.") :]: v for k, v in flat.items() if k.startswith("trunk.")}
        if not trunk:
            raise ScriptError(f"{what} holds no trunk weights (no trunk.* keys in the model).")
        return trunk_to_external(trunk)
    except VisslError as err:
        raise ScriptError(f"{what}: {one_line(err)}") from err


def _timm_config(checkpoint: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """MODEL.TRUNK.TIMM.MODEL_NAME and KWARGS saved in the checkpoint's config, if any."""
    timm_cfg = (((_model_config(checkpoint) or {}).get("TRUNK") or {}).get("TIMM")) or {}
    name = timm_cfg.get("MODEL_NAME") or None
    return name, dict(timm_cfg.get("KWARGS") or {})


def _timm_code(name: str, kwargs: Mapping[str, Any], path: str) -> str:
    args = "".join(f", {k}={v!r}" for k, v in kwargs.items())
    return "\n".join(
        [
            "import timm",
            "import torch",
            "",
            f"model = timm.create_model({name!r}, pretrained=False{args})",
            f"model.load_state_dict(torch.load({path!r}, weights_only=True))",
        ]
    )


def _check_timm(
    name: str | None, kwargs: dict[str, Any], state: Mapping[str, torch.Tensor], what: str
) -> str | None:
    """Load ``state`` strictly into the timm model of the saved config; the loading code."""
    if name is None:
        print(
            f"warning: {what} has no saved config.MODEL.TRUNK.TIMM.MODEL_NAME: the weights "
            "are not checked against a timm model.",
            file=sys.stderr,
        )
        return None
    try:
        import timm
    except ImportError:
        print("warning: timm is not installed: the weights are not checked.", file=sys.stderr)
        return None
    kwargs = {"num_classes": 0, **kwargs}
    try:
        model = timm.create_model(name, pretrained=False, **kwargs)
        model.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError, ValueError) as err:
        raise ScriptError(
            f"{what}: the trunk does not load into timm's {name} ({kwargs}): {one_line(err)}"
        ) from err
    return _timm_code(name, kwargs, "OUT")


def resnet_names(
    checkpoint: Mapping[str, Any],
    trunk: str,
    state: dict[str, torch.Tensor],
    state_dict_key: str,
    what: str,
    loader: str = "torch.load",
) -> tuple[dict[str, torch.Tensor], str | None]:
    """The trunk in torchvision's ResNet names (also timm's), checked where torchvision's
    ResNet can build it; returns ``(state dict, code loading it or None)``: torchvision's
    ResNet, or vissl's trunk for a width torchvision does not build (read with
    ``loader``: ``torch.load`` or ``safetensors``)."""
    if trunk == "resnet" and int(state["conv1.weight"].shape[0]) == 64:
        tv_state, arch, _ = vissl_to_torchvision(checkpoint, state_dict_key, what=what)
        return dict(tv_state), torchvision_code(arch, "OUT", None)
    if trunk == "resnet":
        width = int(state["conv1.weight"].shape[0])
        print(
            f"warning: {what}'s ResNet has a stem of {width} channels (RESNETS."
            f"WIDTH_MULTIPLIER {width / 64:g}); torchvision's and timm's ResNets are built at "
            "width 64 only, so the file has torchvision's names but loads into a ResNet of "
            "this width: vissl's trunk (the code below), or config.MODEL.WEIGHTS_INIT.",
            file=sys.stderr,
        )
        return state, vissl_trunk_code(checkpoint, "OUT", loader)
    # a timm trunk: its names are torchvision's when the timm model is a plain ResNet
    if "conv1.weight" not in state or "layer1.0.conv1.weight" not in state:
        name, _ = _timm_config(checkpoint)
        raise ScriptError(
            f"{what} has a timm trunk ({name or 'model name not saved'}) that is no "
            "torchvision ResNet; export it with --format timm or --format safetensors."
        )
    arch = infer_arch(state, f"{what}'s trunk")
    model = build_torchvision_resnet(arch)
    tv_state = {k: v for k, v in state.items() if not k.startswith("fc.")}
    try:
        model.load_state_dict(tv_state, strict=True)
    except RuntimeError as err:
        raise ScriptError(
            f"{what}'s timm ResNet does not fit torchvision's {arch.builder or 'ResNet'}: "
            f"{one_line(err)}; export it with --format timm."
        ) from err
    return tv_state, torchvision_code(arch, "OUT", None)


def _trunk_overrides(trunk: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The blocks of a saved ``config.MODEL.TRUNK`` that differ from the defaults, by key."""
    from vissl.config.validation import default_tree

    defaults = default_tree()["MODEL"]["TRUNK"]
    out: dict[str, dict[str, Any]] = {}
    for family, values in trunk.items():
        default = defaults.get(family)
        if not isinstance(values, Mapping) or not isinstance(default, Mapping):
            continue
        changed = {k: v for k, v in values.items() if default.get(k) != v}
        if changed:
            out[str(family)] = changed
    return out


def vissl_trunk_code(
    checkpoint: Mapping[str, Any], path: str, loader: str = "torch.load"
) -> str | None:
    """Python lines that build vissl's trunk of the checkpoint's ``config.MODEL.TRUNK``
    (without heads, Hydra or a config file) and load the exported ``path`` into it; None
    when the checkpoint records no config."""
    model_config = _model_config(checkpoint)
    trunk_config = (model_config or {}).get("TRUNK") or {}
    name = trunk_config.get("NAME")
    if not name:
        return None
    load = (
        f"state = load_file({path!r})  # torchvision's names"
        if loader == "safetensors"
        else f"state = torch.load({path!r}, weights_only=True)  # torchvision's names"
    )
    lines = [
        "import torch",
        *(["from safetensors.torch import load_file"] if loader == "safetensors" else []),
        "from vissl.config import AttrDict",
        "from vissl.config.validation import default_tree",
        "from vissl.models.trunks import get_model_trunk",
        "from vissl.utils.external_weights import RESNET_TRUNK_PREFIX",
        "",
        "# vissl's trunk with the checkpoint's config.MODEL.TRUNK (the other keys: defaults)",
        "model_config = AttrDict(default_tree()['MODEL'])",
        *(
            f"model_config.TRUNK.{family}.update({values!r})"
            for family, values in _trunk_overrides(trunk_config).items()
        ),
        f"trunk = get_model_trunk({name!r})(model_config, {name!r})",
        load,
        "trunk.load_state_dict({RESNET_TRUNK_PREFIX + k: v for k, v in state.items()})",
        "trunk.eval()",
        "# trunk(images) with images (N, 3, H, W): a list, one tensor per output feature",
    ]
    return "\n".join(lines)


def export_trunk(
    checkpoint: Mapping[str, Any],
    fmt: str,
    state_dict_key: str = "classy_state_dict",
    what: str = "the checkpoint",
) -> tuple[dict[str, torch.Tensor], dict[str, str], str | None]:
    """The trunk of ``checkpoint`` for ``fmt``.

    Returns:
        ``(state dict, safetensors metadata, Python code loading the file or None)``; the
        code names the file ``OUT``.

    Raises:
        ScriptError: the trunk has no such export.
    """
    if fmt not in FORMATS:
        raise ScriptError(f"--format {fmt!r}: use one of {list(FORMATS)}.")
    trunk, state = trunk_state(checkpoint, state_dict_key, what)
    metadata = {"vissl_trunk": trunk}
    if trunk == "timm":
        name, kwargs = _timm_config(checkpoint)
        if name:
            metadata["timm_model_name"] = name
        if fmt == "torchvision":
            out, code = resnet_names(checkpoint, trunk, state, state_dict_key, what)
            return out, {**metadata, "format": "torchvision"}, code
        return state, {**metadata, "format": "timm"}, _check_timm(name, kwargs, state, what)
    loader = "safetensors" if fmt == "safetensors" else "torch.load"
    out, code = resnet_names(checkpoint, trunk, state, state_dict_key, what, loader)
    # timm's ResNet names are torchvision's: the same file serves both
    return out, {**metadata, "format": "timm" if fmt == "timm" else "torchvision"}, code


def write(state: Mapping[str, torch.Tensor], path: str, fmt: str, metadata: dict[str, str]) -> None:
    """Write ``state`` to ``path`` atomically (torch file, or safetensors)."""
    if fmt != "safetensors":
        atomic_torch_save(dict(state), path)
        return
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".safetensors.tmp")
    os.close(fd)
    try:
        save_safetensors(state, tmp, metadata)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="extra_scripts/export_trunk.py", description=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument("input", help="a vissl checkpoint (model_*.torch)")
    parser.add_argument("output", help="the file to write")
    parser.add_argument("--format", choices=FORMATS, required=True, help="the key names/file")
    parser.add_argument(
        "--state-dict-key",
        default="classy_state_dict",
        help="where the model is in the checkpoint, as MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME "
        "(ema_model: the EMA weights of HOOKS.EMA_MODEL)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not os.path.isfile(args.input):
        raise ScriptError(f"{args.input} does not exist.")
    try:
        checkpoint = load_checkpoint(args.input)
    except VisslError as err:
        raise ScriptError(f"{args.input} does not load safely: {one_line(err)}") from err
    if not isinstance(checkpoint, Mapping):
        raise ScriptError(f"{args.input} holds a {type(checkpoint).__name__}, not a checkpoint.")
    state, metadata, code = export_trunk(
        checkpoint, args.format, args.state_dict_key, what=args.input
    )
    write(state, args.output, args.format, metadata)
    print(
        f"wrote the {metadata['vissl_trunk']} trunk ({len(state)} tensors, "
        f"{metadata['format']} names) to {args.output}"
    )
    if code is not None and (args.format != "safetensors" or "load_file(" in code):
        print("load it with:")
        print(code.replace("'OUT'", repr(args.output)))
    print(f"or into vissl's trunk: config.MODEL.WEIGHTS_INIT.PARAMS_FILE={args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

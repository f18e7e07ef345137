"""What the checkpoint converters share: reading a weights file, finding the trunk and
heads in it, recognising the trunk, checking a ResNet against our ``resnet`` trunk, and
writing a file in vissl's checkpoint layout.

Every user mistake is a :class:`ScriptError` (one ``error: ...`` line, exit code 2).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from _common import ScriptError, one_line

from vissl.errors import VisslError
from vissl.models.trunks import get_model_trunk
from vissl.models.trunks.resnext import BLOCK_CONFIG
from vissl.utils.checkpoint import atomic_torch_save, load_checkpoint
from vissl.utils.external_weights import is_plain_state_dict
from vissl.utils.vissl_key_maps import FEATURE_BLOCKS, is_regnet_model, strip_wrappers
from vissl.utils.weights_init import extract_state_dict

#: Where a linear-evaluation (feature extractor) trunk keeps the pretraining trunk.
FEATURE_EXTRACTOR = "base_model."


def load_file(path: str, namespaces: bool = False) -> Mapping[str, Any]:
    """The content of a weights file, read with ``torch.load(weights_only=True)``.

    Args:
        path: the file.
        namespaces: also accept ``argparse.Namespace`` objects (the ``args`` entry of
            facebookresearch/dino's checkpoints), rebuilt as plain attribute holders.

    Raises:
        ScriptError: the file is missing, not a dict, or holds other pickled objects.
    """
    if "://" in path:
        raise ScriptError(f"{path!r}: only local files are read; download it first.")
    if not os.path.isfile(path):
        raise ScriptError(f"{path} does not exist.")
    try:
        if namespaces:
            with torch.serialization.safe_globals([argparse.Namespace]):
                loaded = torch.load(path, map_location="cpu", weights_only=True)
        else:
            loaded = load_checkpoint(path)
    except Exception as err:  # torch raises many kinds (UnpicklingError, RuntimeError, ...)
        raise ScriptError(
            f"{path} is not a checkpoint or state dict that loads safely: {one_line(err)}"
        ) from err
    if not isinstance(loaded, Mapping):
        raise ScriptError(f"{path} holds a {type(loaded).__name__}, not a dict of weights.")
    return loaded


def model_parts(
    checkpoint: Mapping[str, Any], state_dict_key: str | None, what: str
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], bool]:
    """``(trunk, heads, is_vissl)`` of a loaded file.

    Args:
        checkpoint: the loaded file: a vissl / VISSL checkpoint, a dict holding a state
            dict under ``state_dict_key``, or a state dict.
        state_dict_key: as MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME; None: ``classy_state_dict``
            when the file has one, else the file itself.
        what: the file, for messages.

    Returns:
        The trunk's state dict without ``trunk.`` (and without ``base_model.`` for a
        linear-evaluation trunk), the heads' state dict without ``heads.``, and whether the
        weights were a vissl/VISSL model (for a plain state dict, ``trunk`` is all of it,
        ``module.`` and wrapper levels removed, and ``heads`` is empty).

    Raises:
        ScriptError: the key is not in the file, or it holds no weights.
    """
    key = state_dict_key
    if key is None:
        key = "classy_state_dict" if "classy_state_dict" in checkpoint else ""
    if key == "" and not is_plain_state_dict(checkpoint):
        for inner in ("model_state_dict", "state_dict", "model"):
            if is_plain_state_dict(checkpoint.get(inner)):
                key = inner
                break
    try:
        flat, is_vissl = extract_state_dict(checkpoint, key)
    except VisslError as err:
        raise ScriptError(f"{what}: {one_line(err)}") from err
    if not is_vissl:
        return {strip_wrappers(k): v for k, v in flat.items()}, {}, False
    trunk = {k[len("trunk.") :]: v for k, v in flat.items() if k.startswith("trunk.")}
    heads = {k[len("heads.") :]: v for k, v in flat.items() if k.startswith("heads.")}
    if trunk and all(k.startswith(FEATURE_EXTRACTOR) for k in trunk):
        trunk = {k[len(FEATURE_EXTRACTOR) :]: v for k, v in trunk.items()}
    trunk = {strip_wrappers(k): v for k, v in trunk.items()}
    if not trunk:
        raise ScriptError(f"{what} holds no trunk weights (no trunk.* keys in the model).")
    return trunk, heads, True


def vissl_checkpoint(
    trunk: Mapping[str, torch.Tensor], heads: Mapping[str, torch.Tensor] | None = None
) -> dict[str, Any]:
    """A file in vissl's checkpoint layout (``classy_state_dict.base_model.model``), which
    ``config.MODEL.WEIGHTS_INIT.PARAMS_FILE`` loads with no other WEIGHTS_INIT key."""
    model = {"trunk": dict(trunk), "heads": dict(heads or {}), "other": {}}
    return {"classy_state_dict": {"base_model": {"model": model, "meta": {}}}}


def save(obj: Any, path: str) -> None:
    """``torch.save`` through a temporary file and a rename (never a half-written file)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    atomic_torch_save(obj, path)


def is_resnet_trunk(trunk: Mapping[str, Any]) -> bool:
    """Our ``resnet`` trunk's names (VISSL's: torchvision's under ``_feature_blocks.``)."""
    return f"{FEATURE_BLOCKS}conv1.weight" in trunk and any(
        k.startswith(f"{FEATURE_BLOCKS}layer1.0.") for k in trunk
    )


def is_regnet_trunk(trunk: Mapping[str, Any]) -> bool:
    """Our ``regnet`` trunk's names (torchvision's blocks under ``_feature_blocks.``)."""
    return is_regnet_model(trunk)


def is_vissl_regnet_trunk(trunk: Mapping[str, Any]) -> bool:
    """VISSL's ``regnet`` trunk names (ClassyVision's blocks, SEER's groups)."""
    return any(k.startswith(f"{FEATURE_BLOCKS}conv1.stem.") for k in trunk)


@dataclass(frozen=True)
class ResNetShape:
    """The ``config.MODEL.TRUNK.RESNETS`` of a ResNet's weights (torchvision's names)."""

    depth: int
    bottleneck: bool
    width: int
    groups: int
    width_per_group: int
    small_image_stem: bool

    def overrides(self) -> list[str]:
        """The command-line overrides of our ``resnet`` trunk with this shape."""
        key = "config.MODEL.TRUNK.RESNETS"
        out = [
            "config.MODEL.TRUNK.NAME=resnet",
            f"{key}.DEPTH={self.depth}",
            f"{key}.WIDTH_MULTIPLIER={self.width / 64:g}",
            f"{key}.SMALL_IMAGE_STEM={self.small_image_stem}",
        ]
        if self.groups != 1 or self.width_per_group != 64:
            out += [f"{key}.GROUPS={self.groups}", f"{key}.WIDTH_PER_GROUP={self.width_per_group}"]
        return out

    def trunk_config(self) -> dict[str, Any]:
        """``config.MODEL`` of our ``resnet`` trunk with this shape (the rest defaults)."""
        resnets = {
            "DEPTH": self.depth,
            "WIDTH_MULTIPLIER": self.width / 64,
            "SMALL_IMAGE_STEM": self.small_image_stem,
            "GROUPS": self.groups,
            "WIDTH_PER_GROUP": self.width_per_group,
        }
        return {"INPUT_TYPE": "rgb", "TRUNK": {"NAME": "resnet", "RESNETS": resnets}}


def _block_count(state: Mapping[str, Any], layer: int) -> int:
    pattern = re.compile(rf"^layer{layer}\.(\d+)\.")
    found = {int(m.group(1)) for k in state if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def resnet_shape(state: Mapping[str, torch.Tensor], what: str) -> ResNetShape:
    """The shape of ResNet weights in torchvision's names (our trunk's, without
    ``_feature_blocks.``), any width.

    Raises:
        ScriptError: not a ResNet that our ``resnet`` trunk builds.
    """
    conv1 = state.get("conv1.weight")
    if conv1 is None or "layer1.0.conv1.weight" not in state:
        raise ScriptError(f"{what} are not ResNet weights (no conv1 / layer1.0.conv1).")
    width, kernel = int(conv1.shape[0]), int(conv1.shape[-1])
    bottleneck = "layer1.0.conv3.weight" in state
    layers = tuple(_block_count(state, i) for i in (1, 2, 3, 4))
    depth = next(
        (
            d
            for d, (b, ls) in BLOCK_CONFIG.items()
            if ls == layers and (b.expansion == 4) == bottleneck
        ),
        None,
    )
    if depth is None:
        kind = "bottleneck" if bottleneck else "basic"
        raise ScriptError(
            f"{what}: {kind} stages of {list(layers)} blocks are no ResNet depth our resnet "
            f"trunk builds ({sorted(BLOCK_CONFIG)})."
        )
    groups, width_per_group = 1, 64
    if bottleneck:
        inner, per_group = (int(s) for s in state["layer1.0.conv2.weight"].shape[:2])
        groups = inner // per_group
        width_per_group = round(inner / groups * 64 / width)
    return ResNetShape(depth, bottleneck, width, groups, width_per_group, kernel == 3)


def check_resnet_trunk(trunk: Mapping[str, torch.Tensor], what: str) -> ResNetShape:
    """Load ``trunk`` (our names) strictly into our ``resnet`` trunk of its shape.

    Raises:
        ScriptError: the weights do not fit the trunk of their shape.
    """
    state = {k[len(FEATURE_BLOCKS) :]: v for k, v in trunk.items() if k.startswith(FEATURE_BLOCKS)}
    shape = resnet_shape(state, what)
    try:
        model = get_model_trunk("resnet")(shape.trunk_config(), "resnet")
        model.load_state_dict(dict(trunk), strict=True)
    except (RuntimeError, VisslError) as err:
        raise ScriptError(f"{what} does not fit our resnet trunk: {one_line(err)}") from err
    return shape

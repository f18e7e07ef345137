"""Weights of other libraries in and out of vissl trunks: torchvision, timm, safetensors.

The way in is ``MODEL.WEIGHTS_INIT.PARAMS_FILE`` (vissl/utils/weights_init.py calls
:func:`load_weights_file` and :func:`map_external_state_dict`): a plain state dict, in a
``.pth`` / ``.torch`` file or a ``.safetensors`` file, loads into the trunk it belongs to
without STATE_DICT_KEY_NAME or prefix settings:

=====================  ============================================  ==========================
model trunk            file keys                                     model keys
=====================  ============================================  ==========================
``resnet``             torchvision's (= timm's) ResNet names:         ``trunk._feature_blocks.``
                       ``conv1.weight``, ``layer1.0.bn1.bias``, ...   + file key
``timm``               the timm model's own names                     ``trunk.timm_model.``
                                                                      + file key
=====================  ============================================  ==========================

A ``module.`` prefix (DDP) is removed; a classifier the trunk does not have (``fc.*``,
``head.*``, ``classifier.*``) is left out, with a log line. Any other difference, a trunk
key the file lacks, a file key the trunk lacks or another shape, is a
:class:`~vissl.errors.ConfigError` that lists a few of each. The mapping applies only when
REMOVE_PREFIX and APPEND_PREFIX are empty (with them, the keys are renamed as they say).

The way out is ``extra_scripts/export_trunk.py``, which uses :func:`trunk_to_external` and
:func:`save_safetensors`.

This module works on key names only (utils imports nothing above it): a trunk is
recognised by its key prefix, :data:`RESNET_TRUNK_PREFIX` or :data:`TIMM_TRUNK_PREFIX`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from vissl.errors import ConfigError
from vissl.utils.checkpoint import load_checkpoint

logger = logging.getLogger(__name__)

KEY = "config.MODEL.WEIGHTS_INIT"
#: Key prefix of vissl's ResNe(X)t trunk (``resnet``) layers inside the trunk.
RESNET_TRUNK_PREFIX = "_feature_blocks."
#: Key prefix of the timm model inside vissl's ``timm`` trunk.
TIMM_TRUNK_PREFIX = "timm_model."
#: Where a linear-evaluation (feature extractor) model keeps the pretraining trunk.
_FEATURE_EXTRACTOR = "base_model."
#: Classifier names of torchvision and timm models, which vissl trunks do not have.
CLASSIFIER_PREFIXES = ("fc.", "head.", "classifier.", "last_linear.", "head_dist.")
#: The names of the supported external layouts, by vissl trunk.
LAYOUTS = {"resnet": "torchvision/timm ResNet", "timm": "timm"}
_SHOW = 5


def load_weights_file(path: str) -> Any:
    """The content of a weights file: a ``.safetensors`` file's dict of tensors, or what
    ``torch.load(weights_only=True)`` reads from any other file.

    Raises:
        ConfigError: a ``.safetensors`` file without the safetensors package, or one that
            does not read.
        CheckpointLoadError: a torch file that does not load safely.
    """
    if not str(path).endswith(".safetensors"):
        return load_checkpoint(path)
    try:
        from safetensors.torch import load_file
    except ImportError as err:
        raise ConfigError(
            f"{KEY}.PARAMS_FILE={path!r} is a .safetensors file but the safetensors package "
            "is not installed: pip install safetensors.",
            f"{KEY}.PARAMS_FILE",
        ) from err
    try:
        return dict(load_file(str(path), device="cpu"))
    except Exception as err:  # safetensors raises its own SafetensorError / OSError
        raise ConfigError(
            f"{KEY}.PARAMS_FILE={path!r} is not a readable safetensors file: {err}",
            f"{KEY}.PARAMS_FILE",
        ) from err


def save_safetensors(
    state: Mapping[str, torch.Tensor], path: str, metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``state`` to ``path`` with the safetensors package (contiguous copies, since
    safetensors refuses views and shared storage)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
    save_file(tensors, str(path), metadata=dict(metadata or {}))


def is_plain_state_dict(obj: Any) -> bool:
    """True for a non-empty mapping of names to tensors (a torchvision / timm state dict),
    as opposed to a checkpoint holding one under a key."""
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(isinstance(v, torch.Tensor | np.ndarray) for v in obj.values())
    )


def trunk_layout(model_keys: Sequence[str] | Mapping[str, Any]) -> tuple[str, str] | None:
    """``(trunk name, model key prefix of its external names)`` of a model's state dict keys,
    e.g. ``("resnet", "trunk._feature_blocks.")``; None for a trunk with no external layout."""
    for trunk in ("trunk.", f"trunk.{_FEATURE_EXTRACTOR}"):
        for name, prefix in (("resnet", RESNET_TRUNK_PREFIX), ("timm", TIMM_TRUNK_PREFIX)):
            if any(str(k).startswith(trunk + prefix) for k in model_keys):
                return name, trunk + prefix
    return None


def _looks_like_resnet(state: Mapping[str, Any]) -> bool:
    return "conv1.weight" in state and any(k.startswith("layer1.0.") for k in state)


def _strip_module(state: Mapping[str, Any]) -> dict[str, Any]:
    if state and all(str(k).startswith("module.") for k in state):
        return {str(k)[len("module.") :]: v for k, v in state.items()}
    return {str(k): v for k, v in state.items()}


def _few(keys: Sequence[str]) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - _SHOW} more" if len(keys) > _SHOW else ""
    return f"{keys[:_SHOW]}{more}"


def map_external_state_dict(
    state: Mapping[str, Any],
    model_state: Mapping[str, torch.Tensor],
    skip_layers: Sequence[str] = (),
    source: str = "the weights file",
) -> dict[str, Any] | None:
    """A torchvision / timm state dict renamed to the model's trunk keys.

    Args:
        state: the file's flat state dict (external key names).
        model_state: the model's state dict (its keys and shapes).
        skip_layers: WEIGHTS_INIT.SKIP_LAYERS: model keys containing one of these strings
            need not be in the file.
        source: the file, for messages.

    Returns:
        The state dict with model key names (``trunk.<prefix><file key>``), or None when
        the model's trunk has no external layout or the file is not in it (a ``resnet``
        trunk and a file without ``conv1.weight`` / ``layer1.0.*``), or the file already
        uses vissl's ``trunk.*`` / ``heads.*`` names.

    Raises:
        ConfigError: the file is in the trunk's layout but its keys or shapes do not match
            the trunk: lists a few missing, unexpected and mismatched keys.
    """
    layout = trunk_layout(list(model_state))
    if layout is None:
        return None
    trunk, prefix = layout
    state = _strip_module(state)
    if any(k.startswith(("trunk.", "heads.")) for k in state):
        return None
    if trunk == "resnet" and not _looks_like_resnet(state):
        return None
    model_trunk = {k[len(prefix) :]: v for k, v in model_state.items() if k.startswith(prefix)}
    dropped = [k for k in state if k not in model_trunk and k.startswith(CLASSIFIER_PREFIXES)]
    if dropped:
        logger.info(
            "%s: %s: the classifier %s is not part of the trunk; left out.",
            KEY,
            source,
            _few(dropped),
        )
    kept = {k: v for k, v in state.items() if k not in dropped}
    missing = [
        k for k in model_trunk if k not in kept and not any(s in prefix + k for s in skip_layers)
    ]
    unexpected = [k for k in kept if k not in model_trunk]
    mismatched = [
        f"{k}: file {tuple(kept[k].shape)} vs trunk {tuple(model_trunk[k].shape)}"
        for k in kept
        if k in model_trunk and tuple(kept[k].shape) != tuple(model_trunk[k].shape)
    ]
    if missing or unexpected or mismatched:
        lines = [
            f"{KEY}.PARAMS_FILE: {source} is read as a {LAYOUTS[trunk]} state dict for the "
            f"{trunk!r} trunk (model keys {prefix}<file key>), but it does not match the trunk:"
        ]
        if missing:
            lines.append(f"missing in the file ({len(missing)}): {_few(missing)}")
        if unexpected:
            lines.append(f"unexpected in the file ({len(unexpected)}): {_few(unexpected)}")
        if mismatched:
            lines.append(f"shape mismatch ({len(mismatched)}): {_few(mismatched)}")
        lines.append(
            "Build the trunk the weights come from (config.MODEL.TRUNK: depth, width, stem; "
            "for timm, TIMM.MODEL_NAME and TIMM.KWARGS), or rename the keys yourself with "
            f"{KEY}.REMOVE_PREFIX / APPEND_PREFIX."
        )
        raise ConfigError("\n".join(lines), f"{KEY}.PARAMS_FILE")
    logger.info(
        "%s: %s read as a %s state dict (%d tensors) for the %r trunk",
        KEY,
        source,
        LAYOUTS[trunk],
        len(kept),
        trunk,
    )
    return {prefix + k: v for k, v in kept.items()}


def trunk_to_external(
    trunk_state: Mapping[str, torch.Tensor],
) -> tuple[str, dict[str, torch.Tensor]]:
    """A vissl trunk's state dict (keys without ``trunk.``) in its library's names.

    Returns:
        ``(trunk name, state dict)``: ``resnet`` with torchvision's (= timm's) ResNet names,
        or ``timm`` with the timm model's names. A linear-evaluation trunk
        (``base_model.*``) gives its pretraining trunk.

    Raises:
        ConfigError: the trunk is neither vissl's ResNet nor its timm trunk.
    """
    state = dict(trunk_state)
    if state and all(k.startswith(_FEATURE_EXTRACTOR) for k in state):
        state = {k[len(_FEATURE_EXTRACTOR) :]: v for k, v in state.items()}
    for name, prefix in (("resnet", RESNET_TRUNK_PREFIX), ("timm", TIMM_TRUNK_PREFIX)):
        if state and all(k.startswith(prefix) for k in state):
            return name, {k[len(prefix) :]: v for k, v in state.items()}
    raise ConfigError(
        "only the 'resnet' and 'timm' trunks have an external layout (keys under "
        f"{RESNET_TRUNK_PREFIX!r} or {TIMM_TRUNK_PREFIX!r}); this trunk's keys look like "
        f"{_few(list(state))}.",
        "config.MODEL.TRUNK.NAME",
    )

"""``MODEL.WEIGHTS_INIT``: initialise a model from a weights file (no resume checkpoint).

The file is one of our checkpoints (``STATE_DICT_KEY_NAME: classy_state_dict``) or any
state dict (e.g. torchvision's, with ``STATE_DICT_KEY_NAME: ""`` and
``APPEND_PREFIX: trunk._feature_blocks.``). Every model parameter and buffer must be found
with the right shape, unless its name contains an entry of ``SKIP_LAYERS``; heads are
loaded only when the file holds head weights. Anything else is an error that lists the
keys, so a partial load never passes silently.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.utils.checkpoint import load_checkpoint

logger = logging.getLogger(__name__)

KEY = "config.MODEL.WEIGHTS_INIT"


def _flatten_vissl_state(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``{"base_model": {"model": {"trunk", "heads"}}}`` -> ``{"trunk.x": t, "heads.y": t}``."""
    model = state["base_model"]["model"]
    flat = {f"trunk.{k}": v for k, v in model.get("trunk", {}).items()}
    flat.update({f"heads.{k}": v for k, v in model.get("heads", {}).items()})
    flat.update(model.get("other", {}))
    return flat


def extract_state_dict(checkpoint: Mapping[str, Any], key_name: str) -> dict[str, torch.Tensor]:
    """The flat state dict inside ``checkpoint`` under ``key_name`` ("" = the file itself)."""
    state: Any = checkpoint
    if key_name:
        if key_name not in checkpoint:
            raise ConfigError(
                f"{KEY}.STATE_DICT_KEY_NAME={key_name!r} is not in the weights file; its top-level "
                f"keys are {sorted(checkpoint)[:20]}. Use one of them, or '' for a plain state dict.",
                f"{KEY}.STATE_DICT_KEY_NAME",
            )
        state = checkpoint[key_name]
    if isinstance(state, Mapping) and "base_model" in state:
        return _flatten_vissl_state(state)
    if not isinstance(state, Mapping) or not all(
        isinstance(v, torch.Tensor) for v in state.values()
    ):
        raise ConfigError(
            f"the weights under {key_name or 'the file root'!r} are not a state dict of tensors.",
            f"{KEY}.STATE_DICT_KEY_NAME",
        )
    return dict(state)


def init_model_from_weights_params_file(model: nn.Module, weights_cfg: Mapping[str, Any]) -> None:
    """Load ``weights_cfg.PARAMS_FILE`` into ``model`` following the WEIGHTS_INIT keys.

    Raises:
        ConfigError: missing file, wrong key name, or model keys missing / of the wrong
            shape in the file (listed), unless matched by SKIP_LAYERS.
    """
    path = str(weights_cfg["PARAMS_FILE"])
    try:
        checkpoint = load_checkpoint(path)
    except Exception as err:
        raise ConfigError(
            f"{KEY}.PARAMS_FILE={path!r} cannot be loaded: {err}", f"{KEY}.PARAMS_FILE"
        ) from err
    source = extract_state_dict(checkpoint, str(weights_cfg.get("STATE_DICT_KEY_NAME", "")))
    remove, append = (
        str(weights_cfg.get("REMOVE_PREFIX", "")),
        str(weights_cfg.get("APPEND_PREFIX", "")),
    )
    renamed: dict[str, torch.Tensor] = {}
    for name, value in source.items():
        if remove and name.startswith(remove):
            name = name[len(remove) :]
        renamed[append + name] = value
    skip = [s for s in weights_cfg.get("SKIP_LAYERS", []) if s]
    target = model.state_dict()
    file_has_heads = any(k.startswith("heads.") for k in renamed)
    missing, mismatched, loaded = [], [], {}
    for name, tensor in target.items():
        if any(s in name for s in skip):
            continue
        if name.startswith("heads.") and not file_has_heads:
            continue  # trunk-only weights: heads keep their initialisation
        if name not in renamed:
            missing.append(name)
        elif tuple(renamed[name].shape) != tuple(tensor.shape):
            mismatched.append(
                f"{name}: file {tuple(renamed[name].shape)} vs model {tuple(tensor.shape)}"
            )
        else:
            loaded[name] = renamed[name]
    if missing or mismatched:
        lines = [f"{KEY}: {path} does not match the model."]
        if missing:
            lines.append(f"missing in the file ({len(missing)}): {missing[:30]}")
        if mismatched:
            lines.append(f"shape mismatch ({len(mismatched)}): {mismatched[:30]}")
        lines.append(
            f"Fix the prefixes ({KEY}.REMOVE_PREFIX / APPEND_PREFIX; file keys look like "
            f"{list(source)[:3]}) or skip layers on purpose with {KEY}.SKIP_LAYERS."
        )
        raise ConfigError("\n".join(lines), f"{KEY}.PARAMS_FILE")
    model.load_state_dict(loaded, strict=False)
    unused = sorted(set(renamed) - set(loaded))
    logger.info(
        "initialised %d tensors from %s%s",
        len(loaded),
        path,
        f"; {len(unused)} file entries unused (e.g. {unused[:5]})" if unused else "",
    )

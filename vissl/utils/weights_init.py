"""``MODEL.WEIGHTS_INIT``: initialise a model from a weights file (no resume checkpoint).

Keys, as in VISSL:

- ``PARAMS_FILE``: the file (one of our checkpoints, a VISSL checkpoint, or any state dict).
- ``STATE_DICT_KEY_NAME``: where the weights are inside the file: ``classy_state_dict``
  (our and VISSL's checkpoints), another top-level key (``model_state_dict``, ``model``...),
  a list of nested keys, or ``""`` for a file that is the state dict itself. A first key
  that is not at the top level of one of our checkpoints is looked up inside its
  ``classy_state_dict``: ``ema_model`` (the same as ``[classy_state_dict, ema_model]``)
  loads the exponential moving average saved by ``HOOKS.EMA_MODEL``.
- ``SKIP_LAYERS``: a model key containing one of these strings is not loaded.
- ``REMOVE_PREFIX`` then ``APPEND_PREFIX``: rename the keys of a plain state dict, e.g.
  ``APPEND_PREFIX: trunk._feature_blocks.`` for torchvision's ResNet weights. VISSL
  checkpoints already carry ``trunk.`` / ``heads.`` names, so these are not applied to them.

Trunk keys are adapted to the model: a pretraining trunk (``trunk.x``) loads into a
linear-evaluation trunk (``trunk.base_model.x``) and back. VISSL's RegNet names
(ClassyVision's blocks, SEER's grouped stages) and ``classy_vit`` names are renamed to our
``regnet`` / ``vision_transformer`` names (vissl/utils/vissl_key_maps.py); a plain state
dict of a trunk's own names (a VISSL trunk export, DINO's backbone file) gets ``trunk.``.

Heads follow VISSL's rule: they are loaded when ``FEATURE_EVAL_SETTINGS.EVAL_MODE_ON`` is
off (fine-tuning) or when ``EVAL_TRUNK_AND_HEAD`` is on (the pretraining head is evaluated).
In evaluation mode otherwise the heads are new (e.g. ``eval_mlp`` classifiers) and the
file's heads (e.g. SimCLR's projection) are skipped.

Unlike VISSL, a partial load never passes silently: a model key that should be loaded but
is not in the file, or has another shape, is an error listing the keys (skip them on
purpose with ``SKIP_LAYERS``). What was loaded and skipped is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.utils.external_weights import (
    is_plain_state_dict,
    load_weights_file,
    map_external_state_dict,
)
from vissl.utils.vissl_key_maps import (
    config_parameter_name,
    map_vissl_state_dict,
    prefix_trunk_names,
)

logger = logging.getLogger(__name__)

KEY = "config.MODEL.WEIGHTS_INIT"
_FEATURE_EXTRACTOR_PREFIX = "trunk.base_model."
_LIST_LIMIT = 30


@dataclass
class WeightsInitReport:
    """What :func:`init_model_from_weights_params_file` did, key by key (model key names)."""

    loaded: list[str] = field(default_factory=list)
    #: model keys matched by SKIP_LAYERS
    skipped: list[str] = field(default_factory=list)
    #: head keys left at their initialisation (evaluation heads, or a file without heads)
    heads_kept: list[str] = field(default_factory=list)
    #: file keys that went into no model key
    unused: list[str] = field(default_factory=list)


def _short(keys: Sequence[str]) -> str:
    keys = list(keys)
    if len(keys) <= _LIST_LIMIT:
        return str(keys)
    return f"{keys[:_LIST_LIMIT]} ... and {len(keys) - _LIST_LIMIT} more"


def _vissl_model(state: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``{"trunk", "heads"}`` mapping of a VISSL model state, or None if ``state`` is not one.

    Accepts a ``classy_state_dict`` (``{"base_model": {"model": ...}}``) and a model's own
    state as VISSL stores the EMA (``{"model": {"trunk", "heads"}, "meta"}``).
    """
    base = state.get("base_model")
    if isinstance(base, Mapping) and isinstance(base.get("model"), Mapping):
        return base["model"]  # type: ignore[no-any-return]
    model = state.get("model")
    if isinstance(model, Mapping) and (
        isinstance(model.get("trunk"), Mapping) or isinstance(model.get("heads"), Mapping)
    ):
        return model
    return None


def _nested(prefix: str, state: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a": {"b": t}}`` -> ``{prefix + "a.b": t}`` (ClassyVision nests heads by block)."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, Mapping):
            out.update(_nested(f"{prefix}{key}.", value))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _flatten_vissl_state(model: Mapping[str, Any]) -> dict[str, Any]:
    """``{"trunk": {"x": t}, "heads": {"y": t}}`` -> ``{"trunk.x": t, "heads.y": t}``; a
    ClassyVision checkpoint's heads ``{"block3-2": {"default_head": {"fc.weight": t}}}``
    become ``heads.block3-2.default_head.fc.weight``."""
    flat = _nested("trunk.", model.get("trunk") or {})
    flat.update(_nested("heads.", model.get("heads") or {}))
    flat.update(model.get("other") or {})
    return flat


def _as_tensor_dict(state: Mapping[str, Any], where: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    bad: list[str] = []
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            out[str(name)] = value
        elif isinstance(value, np.ndarray):  # VISSL's converted Caffe2 weights
            out[str(name)] = torch.from_numpy(value)
        else:
            bad.append(str(name))
    if bad:
        raise ConfigError(
            f"the weights under {where} are not a state dict of tensors: {_short(bad)} hold "
            f"{type(state[bad[0]]).__name__} values. Point {KEY}.STATE_DICT_KEY_NAME at the "
            "state dict inside the file.",
            f"{KEY}.STATE_DICT_KEY_NAME",
        )
    return out


def extract_state_dict(
    checkpoint: Mapping[str, Any], key_name: str | Sequence[str]
) -> tuple[dict[str, torch.Tensor], bool]:
    """The flat state dict inside ``checkpoint`` under ``key_name``.

    Args:
        checkpoint: the loaded file.
        key_name: a top-level key, a list of nested keys, or "" for the file itself.

    Returns:
        (state dict, is_vissl): ``is_vissl`` is True when the weights were a VISSL model
        state (``base_model.model.trunk/heads``, or ``model.trunk/heads`` as VISSL stores
        ``ema_model``), whose keys are already model keys.

    Raises:
        ConfigError: a key is not in the file, or what it points at holds no tensors.
    """
    keys = [key_name] if isinstance(key_name, str) else [str(k) for k in key_name]
    state: Any = checkpoint
    path: list[str] = []
    for key in (k for k in keys if k):
        inner = state.get("classy_state_dict") if isinstance(state, Mapping) else None
        if not path and isinstance(inner, Mapping) and key not in state and key in inner:
            # e.g. "ema_model": classy_state_dict.ema_model of our (and VISSL's) checkpoints
            state = inner
            path.append("classy_state_dict")
        if not isinstance(state, Mapping) or key not in state:
            found = sorted(map(str, state))[:20] if isinstance(state, Mapping) else []
            where = "/".join(path) or "the top level"
            raise ConfigError(
                f"{KEY}.STATE_DICT_KEY_NAME={key_name!r}: {key!r} is not in the weights file "
                f"at {where}; the keys there are {found}. Use one of them, or '' when the "
                "file is the state dict itself.",
                f"{KEY}.STATE_DICT_KEY_NAME",
            )
        state = state[key]
        path.append(key)
    where = "/".join(path) or "the file root"
    model = _vissl_model(state) if isinstance(state, Mapping) else None
    if model is not None:
        return _as_tensor_dict(_flatten_vissl_state(model), where), True
    if not isinstance(state, Mapping):
        raise ConfigError(
            f"the weights under {where} are a {type(state).__name__}, not a state dict.",
            f"{KEY}.STATE_DICT_KEY_NAME",
        )
    return _as_tensor_dict(state, where), False


def _rename(state: Mapping[str, torch.Tensor], remove: str, append: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if remove and name.startswith(remove):
            name = name[len(remove) :]
        out[append + name] = value
    return out


def _adapt_trunk_keys(
    state: Mapping[str, torch.Tensor], target: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """Map ``trunk.x`` <-> ``trunk.base_model.x`` to the trunk layout of the model."""
    model_fe = any(k.startswith(_FEATURE_EXTRACTOR_PREFIX) for k in target)
    trunk_keys = [k for k in state if k.startswith("trunk.")]
    file_fe = bool(trunk_keys) and all(k.startswith(_FEATURE_EXTRACTOR_PREFIX) for k in trunk_keys)
    if model_fe == file_fe or not trunk_keys:
        return dict(state)
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if model_fe and name.startswith("trunk."):
            name = _FEATURE_EXTRACTOR_PREFIX + name[len("trunk.") :]
        elif not model_fe and name.startswith(_FEATURE_EXTRACTOR_PREFIX):
            name = "trunk." + name[len(_FEATURE_EXTRACTOR_PREFIX) :]
        out[name] = value
    return out


def _eval_flags(model_config: Mapping[str, Any] | None) -> tuple[bool, bool]:
    fe = (model_config or {}).get("FEATURE_EVAL_SETTINGS") or {}
    return bool(fe.get("EVAL_MODE_ON", False)), bool(fe.get("EVAL_TRUNK_AND_HEAD", False))


def should_init_head_weights(model_config: Mapping[str, Any] | None) -> bool:
    """VISSL's rule: heads come from the file unless evaluating with new heads.

    True when FEATURE_EVAL_SETTINGS.EVAL_MODE_ON is off (fine-tuning, resuming a recipe)
    or EVAL_TRUNK_AND_HEAD is on (the pretraining head is evaluated).
    """
    eval_mode, trunk_and_head = _eval_flags(model_config)
    return not eval_mode or trunk_and_head


def init_model_from_checkpoint(
    model: nn.Module,
    checkpoint: Mapping[str, Any],
    weights_cfg: Mapping[str, Any],
    model_config: Mapping[str, Any] | None = None,
    source: str = "the weights file",
) -> WeightsInitReport:
    """Load an already read ``checkpoint`` into ``model`` following the WEIGHTS_INIT keys.

    Args:
        model: the model (trunk + heads; keys ``trunk.*`` and ``heads.*``).
        checkpoint: the loaded weights file.
        weights_cfg: config.MODEL.WEIGHTS_INIT.
        model_config: config.MODEL (FEATURE_EVAL_SETTINGS decides whether heads load);
            defaults to ``model.model_config``.
        source: the file name, for messages.

    Returns:
        What was loaded, skipped and left unused.

    Raises:
        ConfigError: no file key matches a model key, model keys to load are missing from
            the file or have another shape (listed), or the evaluated head is absent.
    """
    if model_config is None:
        model_config = getattr(model, "model_config", None)
    key_name = weights_cfg.get("STATE_DICT_KEY_NAME", "classy_state_dict")
    if key_name is None:
        key_name = ""
    if key_name == "classy_state_dict" and is_plain_state_dict(checkpoint):
        key_name = ""  # a torchvision / timm / safetensors state dict: the file is the weights
    source_state, is_vissl = extract_state_dict(checkpoint, key_name)
    remove = str(weights_cfg.get("REMOVE_PREFIX", "") or "")
    append = str(weights_cfg.get("APPEND_PREFIX", "") or "")
    if is_vissl and (remove or append):
        logger.warning(
            "%s.REMOVE_PREFIX/APPEND_PREFIX are ignored: %s is a VISSL checkpoint whose keys "
            "are already trunk.* / heads.*.",
            KEY,
            source,
        )
    renamed = source_state if is_vissl else _rename(source_state, remove, append)
    target = model.state_dict()
    # FSDP-wrapped spellings (VISSL's FSDP configs) name our parameters without the levels
    skip = [
        config_parameter_name(str(s), f"{KEY}.SKIP_LAYERS")
        for s in (weights_cfg.get("SKIP_LAYERS") or [])
        if s
    ]
    # VISSL's / ClassyVision's RegNet and classy_vit names (vissl/utils/vissl_key_maps.py)
    vissl_names = map_vissl_state_dict(renamed, target, source)
    if vissl_names is not None:
        renamed = vissl_names
    elif not is_vissl and not (remove or append):
        # torchvision / timm names for the resnet / timm trunk (vissl/utils/external_weights.py),
        # else a trunk's own names without ``trunk.`` (a VISSL or DINO trunk state dict)
        external = map_external_state_dict(renamed, target, skip, source)
        if external is None:
            external = prefix_trunk_names(renamed, target, source)
        renamed = external if external is not None else renamed
    renamed = _adapt_trunk_keys(renamed, target)

    load_heads = should_init_head_weights(model_config)
    _, trunk_and_head = _eval_flags(model_config)
    file_has_heads = any(k.startswith("heads.") for k in renamed)
    model_has_heads = any(k.startswith("heads.") for k in target)
    if trunk_and_head and load_heads and model_has_heads and not file_has_heads:
        raise ConfigError(
            f"config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_TRUNK_AND_HEAD is on, but {source} "
            "holds no head weights (no heads.* keys after renaming). Evaluate the trunk "
            "instead (EVAL_TRUNK_AND_HEAD: False) or give a checkpoint with its head.",
            "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_TRUNK_AND_HEAD",
        )

    report = WeightsInitReport()
    missing: list[str] = []
    mismatched: list[str] = []
    to_load: dict[str, torch.Tensor] = {}
    fe = (model_config or {}).get("FEATURE_EVAL_SETTINGS") or {}
    # VISSL main's ASSERT_HEAD_LAYER_SHAPE_INIT: False skips heads of another shape
    check_head_shapes = bool(fe.get("ASSERT_HEAD_LAYER_SHAPE_INIT", True))
    for name, tensor in target.items():
        if any(s in name for s in skip):
            report.skipped.append(name)
            continue
        if name.startswith("heads.") and not (load_heads and file_has_heads):
            report.heads_kept.append(name)
            continue
        if name not in renamed:
            missing.append(name)
        elif tuple(renamed[name].shape) != tuple(tensor.shape):
            if name.startswith("heads.") and not check_head_shapes:
                logger.info(
                    "%s: %s has shape %s in the file and %s in the model: not loaded "
                    "(FEATURE_EVAL_SETTINGS.ASSERT_HEAD_LAYER_SHAPE_INIT is False)",
                    KEY,
                    name,
                    tuple(renamed[name].shape),
                    tuple(tensor.shape),
                )
                report.skipped.append(name)
                continue
            mismatched.append(
                f"{name}: file {tuple(renamed[name].shape)} vs model {tuple(tensor.shape)}"
            )
        else:
            to_load[name] = renamed[name]
    hint = (
        f"File keys look like {list(renamed)[:3]}; model keys like {list(target)[:3]}. Fix the "
        f"names with {KEY}.REMOVE_PREFIX / APPEND_PREFIX (or STATE_DICT_KEY_NAME), or skip "
        f"layers on purpose with {KEY}.SKIP_LAYERS."
    )
    if missing or mismatched:
        if to_load:
            lines = [f"{KEY}: {source} does not match the model."]
        else:
            lines = [
                f"{KEY}: nothing in {source} matches the model: none of its {len(renamed)} "
                "keys is a model key of the same shape."
            ]
        if missing:
            lines.append(f"missing in the file ({len(missing)}): {_short(missing)}")
        if mismatched:
            lines.append(f"shape mismatch ({len(mismatched)}): {_short(mismatched)}")
        lines.append(hint)
        raise ConfigError("\n".join(lines), f"{KEY}.PARAMS_FILE")

    model.load_state_dict(
        {k: v.to(dtype=target[k].dtype) for k, v in to_load.items()}, strict=False
    )
    report.loaded = list(to_load)
    report.unused = sorted(set(renamed) - set(to_load))
    _log_report(report, source, load_heads, skip)
    return report


def _log_report(
    report: WeightsInitReport, source: str, load_heads: bool, skip: Sequence[str]
) -> None:
    n_heads = sum(k.startswith("heads.") for k in report.loaded)
    logger.info(
        "%s: loaded %d tensors from %s (trunk: %d, heads: %d)",
        KEY,
        len(report.loaded),
        source,
        len(report.loaded) - n_heads,
        n_heads,
    )
    logger.debug("loaded: %s", report.loaded)
    if report.skipped:
        counts = {s: sum(s in k for k in report.skipped) for s in skip}
        logger.info("skipped by %s.SKIP_LAYERS: %s model keys", KEY, counts)
    if report.heads_kept:
        why = (
            "evaluation heads (FEATURE_EVAL_SETTINGS.EVAL_MODE_ON without EVAL_TRUNK_AND_HEAD)"
            if not load_heads
            else "the file has no head weights"
        )
        logger.info(
            "heads kept at their initialisation, %s (%d): %s",
            why,
            len(report.heads_kept),
            _short(report.heads_kept),
        )
    unused = [k for k in report.unused if not any(s in k for s in skip)]
    if unused:
        logger.info("file entries not loaded (%d): %s", len(unused), _short(unused))


def init_model_from_weights_params_file(
    model: nn.Module,
    weights_cfg: Mapping[str, Any],
    model_config: Mapping[str, Any] | None = None,
) -> WeightsInitReport:
    """Load ``weights_cfg.PARAMS_FILE`` into ``model`` following the WEIGHTS_INIT keys.

    Args:
        model: the model to initialise in place.
        weights_cfg: config.MODEL.WEIGHTS_INIT.
        model_config: config.MODEL; defaults to ``model.model_config``.

    Returns:
        What was loaded, skipped and left unused.

    Raises:
        ConfigError: the file cannot be read, a key name is wrong, or the weights do not
            fit the model (see :func:`init_model_from_checkpoint`).
    """
    path = str(weights_cfg["PARAMS_FILE"])
    try:
        checkpoint = load_weights_file(path)
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(
            f"{KEY}.PARAMS_FILE={path!r} cannot be loaded: {err}", f"{KEY}.PARAMS_FILE"
        ) from err
    if not isinstance(checkpoint, Mapping):
        raise ConfigError(
            f"{KEY}.PARAMS_FILE={path!r} holds a {type(checkpoint).__name__}, not a dict of "
            "weights.",
            f"{KEY}.PARAMS_FILE",
        )
    if checkpoint.get("checkpoint_format") == "sharded_dcp":
        raise ConfigError(
            f"{KEY}.PARAMS_FILE={path!r} is the index of a sharded checkpoint (FSDP task): "
            "write one file of it with python extra_scripts/convert_sharded_checkpoint.py "
            f"{path} OUT.torch and give OUT.torch.",
            f"{KEY}.PARAMS_FILE",
        )
    return init_model_from_checkpoint(model, checkpoint, weights_cfg, model_config, source=path)


def init_model_from_consolidated_weights(
    config: Mapping[str, Any],
    model: nn.Module,
    state_dict: Mapping[str, Any],
    state_dict_key_name: str | Sequence[str],
    skip_layers: Sequence[str],
    replace_prefix: str | None = None,
    append_prefix: str | None = None,
) -> nn.Module:
    """VISSL's function of this name: load ``state_dict`` (a loaded file) into ``model``.

    Args:
        config: the full config (``config.MODEL`` is read).
        model: the model to initialise in place.
        state_dict: the loaded weights file.
        state_dict_key_name: as WEIGHTS_INIT.STATE_DICT_KEY_NAME.
        skip_layers: as WEIGHTS_INIT.SKIP_LAYERS.
        replace_prefix: as WEIGHTS_INIT.REMOVE_PREFIX.
        append_prefix: as WEIGHTS_INIT.APPEND_PREFIX.

    Returns:
        ``model``.
    """
    weights_cfg = {
        "STATE_DICT_KEY_NAME": state_dict_key_name,
        "SKIP_LAYERS": list(skip_layers),
        "REMOVE_PREFIX": replace_prefix or "",
        "APPEND_PREFIX": append_prefix or "",
    }
    init_model_from_checkpoint(model, state_dict, weights_cfg, config.get("MODEL"))
    return model

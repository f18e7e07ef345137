"""``linear_eval_heads``: one learning rate and weight decay per head (linear evaluation).

For linear evaluation of several heads at once (one per evaluated feature), each head
``i`` of ``MODEL.HEAD.PARAMS`` gets the settings of ``OPTIMIZER.linear_eval_heads[i]``:

- ``lr`` (required): a factor on the ``param_schedulers.lr`` schedule;
- ``weight_decay`` (default ``OPTIMIZER.weight_decay``): a fixed weight decay (the
  ``param_schedulers.weight_decay`` schedule does not apply, as in VISSL);
- ``regularize_bn`` (default ``OPTIMIZER.regularize_bn``): decay its norm layers too.

Biases follow ``OPTIMIZER.regularize_bias``, ``non_regularized_parameters`` applies. As in
VISSL only the heads are optimized: trainable parameters outside ``model.heads`` are left
out (with a warning), so freeze the trunk (``FEATURE_EVAL_SETTINGS``). VISSL also left out
the parameters of modules other than linear, convolution and norm layers; here every
trainable head parameter is optimized (others are regularized).

Groups ``head<i>_regularized`` / ``head<i>_unregularized``, in head order.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from vissl.errors import ConfigError
from vissl.optimizers._checks import get_bool, get_number
from vissl.optimizers.param_groups.default import NORM_TYPES, is_bias, non_regularized_substrings
from vissl.optimizers.param_groups.registry import register_param_group_constructor

logger = logging.getLogger(__name__)

_PATH = "config.OPTIMIZER"
_KEY = f"{_PATH}.linear_eval_heads"
#: the keys of one ``linear_eval_heads`` entry
ENTRY_KEYS = ("lr", "weight_decay", "regularize_bn")


def _entries(optimizer_config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    entries = optimizer_config.get("linear_eval_heads") or []
    if isinstance(entries, str | Mapping) or not isinstance(entries, Sequence):
        raise ConfigError(
            f"{_KEY} must be a list with one {{lr: ..., weight_decay: ...}} per head, got "
            f"{entries!r}.",
            _KEY,
        )
    for i, entry in enumerate(entries):
        path = f"{_KEY}[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(
                f"{path} must be a mapping like {{lr: 1.0, weight_decay: 0.0005}}, got {entry!r}.",
                path,
            )
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown:
            raise ConfigError(
                f"{path} has unknown keys {unknown}; an entry takes {list(ENTRY_KEYS)}.",
                f"{path}.{unknown[0]}",
            )
        if "lr" not in entry:
            raise ConfigError(
                f"{path}.lr is required: the factor of this head on the lr schedule (1.0 "
                "keeps the schedule).",
                f"{path}.lr",
            )
    return list(entries)


@register_param_group_constructor("linear_eval_heads")
def linear_eval_heads_param_groups(
    model: nn.Module, model_config: Mapping[str, Any] | None, optimizer_config: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Per-head groups (see the module docstring).

    Raises:
        ConfigError: a malformed ``linear_eval_heads`` or fewer entries than heads.
    """
    entries = _entries(optimizer_config)
    default_wd = get_number(optimizer_config, "weight_decay", _PATH, default=0.0, min_value=0.0)
    default_bn = get_bool(optimizer_config, "regularize_bn", _PATH, default=False)
    regularize_bias = get_bool(optimizer_config, "regularize_bias", _PATH, default=True)
    non_regularized = non_regularized_substrings(optimizer_config)
    base = getattr(model, "module", model)
    heads = getattr(base, "heads", None)
    if not isinstance(heads, nn.ModuleList | nn.Sequential):
        raise ValueError("param_group_constructor 'linear_eval_heads' needs a model with heads.")
    if len(entries) < len(heads):
        raise ConfigError(
            f"{_KEY} has {len(entries)} entries for the {len(heads)} heads of "
            "config.MODEL.HEAD.PARAMS: give one {lr: ..., weight_decay: ...} per head.",
            _KEY,
        )
    if len(entries) > len(heads):
        logger.warning(
            "%s has %d entries for %d heads; the last %d are not used.",
            _KEY,
            len(entries),
            len(heads),
            len(entries) - len(heads),
        )
    groups: list[dict[str, Any]] = []
    in_heads: set[int] = set()
    for index, head in enumerate(heads):
        path = f"{_KEY}[{index}]"
        entry = entries[index]
        scale = get_number(entry, "lr", path, min_value=0.0)
        weight_decay = get_number(entry, "weight_decay", path, default=default_wd, min_value=0.0)
        regularize_bn = get_bool(entry, "regularize_bn", path, default=default_bn)
        buckets: dict[bool, list[nn.Parameter]] = {True: [], False: []}
        for module_name, module in head.named_modules():
            for local, param in module.named_parameters(recurse=False):
                if id(param) in in_heads or not param.requires_grad:
                    continue
                in_heads.add(id(param))
                prefix = f"heads.{index}.{module_name}" if module_name else f"heads.{index}"
                name = f"{prefix}.{local}"
                bias = is_bias(local)
                if isinstance(module, NORM_TYPES):
                    reg = regularize_bn and (regularize_bias or not bias)
                else:
                    reg = regularize_bias or not bias
                if any(s in name for s in non_regularized):
                    reg = False
                buckets[reg].append(param)
        for reg in (True, False):
            if buckets[reg]:
                groups.append(
                    {
                        "params": buckets[reg],
                        "weight_decay": weight_decay if reg else 0.0,
                        "param_group_name": (
                            f"head{index}_{'regularized' if reg else 'unregularized'}"
                        ),
                        "lr_scale": scale,
                        "weight_decay_scheduled": False,
                    }
                )
    left_out = [
        name for name, p in model.named_parameters() if p.requires_grad and id(p) not in in_heads
    ]
    if left_out:
        logger.warning(
            "param_group_constructor 'linear_eval_heads' optimizes the heads only: %d "
            "trainable parameters outside them (e.g. %s) stay as they are; freeze the trunk "
            "to silence this.",
            len(left_out),
            left_out[0],
        )
    return groups

"""``dino``: DINO's two param groups (https://github.com/facebookresearch/dino).

Every trainable parameter is regularized (``OPTIMIZER.weight_decay``, or the
``param_schedulers.weight_decay`` schedule) except the biases (names ending in ``.bias``)
and the parameters whose name contains ``norm``, which get no weight decay. Both groups
follow ``param_schedulers.lr``; ``head_optimizer_params``, ``regularize_bn`` and
``regularize_bias`` are not used (as in VISSL). ``non_regularized_parameters`` (empty by
default) also applies: VISSL's ``dino`` constructor ignored it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from vissl.optimizers._checks import get_number
from vissl.optimizers.param_groups.default import non_regularized_substrings
from vissl.optimizers.param_groups.registry import register_param_group_constructor

_PATH = "config.OPTIMIZER"


def dino_regularized(name: str) -> bool:
    """DINO's rule: no weight decay for biases and normalisation parameters."""
    return not (name.endswith(".bias") or "norm" in name)


@register_param_group_constructor("dino")
def dino_param_groups(
    model: nn.Module, model_config: Mapping[str, Any] | None, optimizer_config: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The ``regularized`` and ``unregularized`` groups (see the module docstring)."""
    weight_decay = get_number(optimizer_config, "weight_decay", _PATH, default=0.0, min_value=0.0)
    non_regularized = non_regularized_substrings(optimizer_config)
    regularized: list[nn.Parameter] = []
    unregularized: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if dino_regularized(name) and not any(s in name for s in non_regularized):
            regularized.append(param)
        else:
            unregularized.append(param)
    groups = [
        {
            "params": regularized,
            "weight_decay": weight_decay,
            "param_group_name": "regularized",
            "weight_decay_scheduled": True,
        },
        {
            "params": unregularized,
            "weight_decay": 0.0,
            "param_group_name": "unregularized",
            "weight_decay_scheduled": False,
        },
    ]
    return [g for g in groups if g["params"]]

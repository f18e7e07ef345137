"""Param-group constructors: ``@register_param_group_constructor(name)`` functions.

Selected by ``OPTIMIZER.param_group_constructor`` (VISSL's names): ``default`` (trunk/head
x regularized/unregularized, :mod:`.default`), ``dino`` (:mod:`.dino`), ``lr_decay``
(layer-wise learning-rate decay, :mod:`.layer_decay`) and ``linear_eval_heads`` (one rate
and weight decay per head, :mod:`.linear_eval_heads`).

A constructor is called as ``fn(model, model_config, optimizer_config)`` (``model_config``
is ``config.MODEL``, or None when the caller has none) and returns the torch param groups,
dicts with:

- ``params``: the parameters (each in one group only; frozen ones left out);
- ``weight_decay``: the group's weight decay;
- ``param_group_name``: a name, for logs and tests;
- ``is_head`` (default False): the group follows ``param_schedulers.lr_head``, not ``lr``;
- ``lr_scale`` (default 1): the group's learning rate is its schedule's value times this
  (layer-wise decay, per-head rates);
- ``weight_decay_scheduled`` (optional): whether ``param_schedulers.weight_decay`` sets the
  group's weight decay; without it the ``default`` groups' names decide (see
  :mod:`vissl.optimizers.param_scheduler.scheduler_set`).

``build_optimizer`` sets each group's initial ``lr``; the schedules set it at every update.
"""

from __future__ import annotations

from vissl.optimizers.param_groups.registry import (
    PARAM_GROUP_CONSTRUCTOR_REGISTRY,
    get_param_group_constructor,
    register_param_group_constructor,
)
from vissl.utils.imports import import_submodules

import_submodules(__name__)

from vissl.optimizers.param_groups.default import (  # noqa: E402
    GROUP_NAMES,
    get_optimizer_param_groups,
    head_weight_decay,
    is_head_parameter,
)

__all__ = [
    "GROUP_NAMES",
    "PARAM_GROUP_CONSTRUCTOR_REGISTRY",
    "get_optimizer_param_groups",
    "get_param_group_constructor",
    "head_weight_decay",
    "is_head_parameter",
    "register_param_group_constructor",
]

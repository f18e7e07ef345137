"""``build_optimizer``: the optimizer of ``config.OPTIMIZER`` over a model's param groups."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.optimizers import OPTIMIZER_REGISTRY
from vissl.optimizers._checks import get_bool, get_number, get_section
from vissl.optimizers.larc import LARC
from vissl.optimizers.param_groups import (
    PARAM_GROUP_CONSTRUCTOR_REGISTRY,
    get_param_group_constructor,
)
from vissl.optimizers.param_scheduler.scheduler_set import ParamSchedulerSet, build_param_schedulers

logger = logging.getLogger(__name__)

_PATH = "config.OPTIMIZER"


def build_larc(optimizer: torch.optim.Optimizer, larc_config: Mapping[str, Any]) -> LARC:
    """Wrap ``optimizer`` in :class:`LARC` configured by ``OPTIMIZER.larc_config``."""
    path = f"{_PATH}.larc_config"
    return LARC(
        optimizer,
        trust_coefficient=get_number(
            larc_config, "trust_coefficient", path, default=0.02, min_value=0.0, min_inclusive=False
        ),
        clip=get_bool(larc_config, "clip", path, default=True),
        eps=get_number(larc_config, "eps", path, default=1e-8, min_value=0.0),
    )


def _schedules_or_placeholders(
    optimizer_config: Mapping[str, Any], param_schedulers: ParamSchedulerSet | None
) -> ParamSchedulerSet:
    if param_schedulers is not None:
        return param_schedulers
    # Without the batch size the schedule cannot be auto-scaled; these are placeholders
    # until ParamSchedulerSet.apply() sets the real values.
    return build_param_schedulers(
        _without_auto_scaling(optimizer_config), batch_size_per_replica=1, world_size=1
    )


def _initial_lrs(param_schedulers: ParamSchedulerSet) -> dict[str, float]:
    values = param_schedulers.values(0.0)
    lrs = {name: values[name] for name in ("lr", "lr_head")}
    for name, value in lrs.items():
        if value < 0:
            raise ConfigError(
                f"{_PATH}.param_schedulers.{name} starts at a negative learning rate ({value}).",
                f"{_PATH}.param_schedulers.{name}",
            )
    return lrs


def _without_auto_scaling(optimizer_config: Mapping[str, Any]) -> dict[str, Any]:
    cfg = dict(optimizer_config)
    schedules = dict(get_section(optimizer_config, "param_schedulers", _PATH))
    for name, sched in list(schedules.items()):
        if isinstance(sched, Mapping):
            sched = dict(sched)
            sched["auto_lr_scaling"] = {"auto_scale": False}
            schedules[name] = sched
    cfg["param_schedulers"] = schedules
    return cfg


def build_param_groups(
    optimizer_config: Mapping[str, Any],
    model: nn.Module,
    lrs: Mapping[str, float],
    model_config: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The param groups of ``OPTIMIZER.param_group_constructor``, each with its initial
    ``lr`` (its schedule's value in ``lrs`` times its ``lr_scale``) and ``is_head``.

    Raises:
        UnknownNameError: an unregistered constructor name.
        ConfigError: settings the constructor rejects, or that contradict it.
    """
    key = f"{_PATH}.param_group_constructor"
    name = optimizer_config.get("param_group_constructor") or "default"
    if not isinstance(name, str):
        raise ConfigError(f"{key} must name a param-group constructor, got {name!r}.", key)
    constructor = get_param_group_constructor(name)
    if name != "default":
        if get_bool(optimizer_config, "construct_single_param_group_only", _PATH):
            raise ConfigError(
                f"{_PATH}.construct_single_param_group_only is true, but {key} is {name!r}: "
                "one group for every parameter is the 'default' constructor's option. Set "
                "one of them back.",
                key,
            )
        head = get_section(optimizer_config, "head_optimizer_params", _PATH)
        if head.get("head_indices") is not None:
            raise ConfigError(
                f"{_PATH}.head_optimizer_params.head_indices chooses the head groups of the "
                f"'default' param-group constructor, but {key} is {name!r}. Drop "
                "head_indices, or use the 'default' constructor.",
                f"{_PATH}.head_optimizer_params.head_indices",
            )
        for option in ("use_different_lr", "use_different_wd"):
            if get_bool(head, option, f"{_PATH}.head_optimizer_params"):
                logger.warning(
                    "%s.head_optimizer_params.%s is not used by %s %r (as in VISSL): its "
                    "groups follow param_schedulers.lr and its own weight decays.",
                    _PATH,
                    option,
                    key,
                    name,
                )
    groups = constructor(model, model_config, optimizer_config)
    if not isinstance(groups, list) or not all(
        isinstance(g, dict) and "params" in g for g in groups
    ):
        raise TypeError(
            f"param-group constructor {name!r} ({PARAM_GROUP_CONSTRUCTOR_REGISTRY.origin(name)}) "
            "must return a list of dicts with 'params'."
        )
    if not groups:
        raise ValueError("the model has no trainable parameter (requires_grad=True) to optimize.")
    for group in groups:
        group.setdefault("is_head", False)
        group.setdefault("param_group_name", name)
        scale = float(group.setdefault("lr_scale", 1.0))
        group["lr"] = lrs["lr_head" if group["is_head"] else "lr"] * scale
    return groups


def _warn_unused_head_weight_decay(
    optimizer_config: Mapping[str, Any], schedules: ParamSchedulerSet, followed: set[str]
) -> None:
    """``param_schedulers.weight_decay_head`` with no group to set, or with a fixed head
    weight decay it replaces: accepted, as VISSL does, but said once."""
    if not schedules.has_weight_decay_head:
        return
    key = f"{_PATH}.param_schedulers.weight_decay_head"
    if "weight_decay_head" not in followed:
        logger.warning(
            "%s is set but no param group follows it (it sets the 'default' constructor's "
            "head_regularized group; this run has param_group_constructor %r%s): it has no "
            "effect, as in VISSL.",
            key,
            optimizer_config.get("param_group_constructor") or "default",
            ", construct_single_param_group_only"
            if get_bool(optimizer_config, "construct_single_param_group_only", _PATH)
            else "",
        )
        return
    head = get_section(optimizer_config, "head_optimizer_params", _PATH)
    if get_bool(head, "use_different_wd", f"{_PATH}.head_optimizer_params"):
        logger.warning(
            "%s.head_optimizer_params.use_different_wd is true but %s is set: the head's "
            "regularized parameters follow the schedule, and "
            "head_optimizer_params.weight_decay is not used (as in VISSL).",
            _PATH,
            key,
        )


def build_optimizer(
    optimizer_config: Mapping[str, Any],
    model: nn.Module,
    *,
    param_schedulers: ParamSchedulerSet | None = None,
    model_config: Mapping[str, Any] | None = None,
) -> torch.optim.Optimizer:
    """Build the optimizer named by ``OPTIMIZER.name`` over ``model``'s param groups.

    Args:
        optimizer_config: ``config.OPTIMIZER``.
        model: the model (head parameters are those of ``model.heads``).
        param_schedulers: the run's schedules; their values at ``where=0`` are the initial
            learning rates (and weight decay of the regularized groups, when
            ``param_schedulers.weight_decay`` or ``weight_decay_head`` is set). Without them the unscaled config
            values are used as placeholders: call ``ParamSchedulerSet.apply`` before the
            first step.
        model_config: ``config.MODEL``, for the param-group constructors that read it
            (``lr_decay``: the trunk and its depth).

    Returns:
        The torch optimizer, wrapped in :class:`LARC` when ``use_larc`` is true. Every param
        group carries ``is_head``, ``param_group_name`` and ``lr_scale`` (see
        :mod:`vissl.optimizers.param_groups`).

    Raises:
        UnknownNameError: an unregistered optimizer name.
        ConfigError: invalid optimizer settings, naming the key.
    """
    name = optimizer_config.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"{_PATH}.name must name an optimizer ({OPTIMIZER_REGISTRY.names()}), got {name!r}.",
            f"{_PATH}.name",
        )
    builder = OPTIMIZER_REGISTRY.get(name)
    use_larc = get_bool(optimizer_config, "use_larc", _PATH, default=False)
    larc_config = get_section(optimizer_config, "larc_config", _PATH)
    schedules = _schedules_or_placeholders(optimizer_config, param_schedulers)
    lrs = _initial_lrs(schedules)
    param_groups = build_param_groups(optimizer_config, model, lrs, model_config)
    optimizer = builder(optimizer_config, param_groups)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer builder {name!r} ({OPTIMIZER_REGISTRY.origin(name)}) returned "
            f"{type(optimizer).__name__}, expected a torch.optim.Optimizer."
        )
    if schedules.has_weight_decay or schedules.has_weight_decay_head:
        # The regularized groups start at their weight-decay schedule's value at where=0.
        start = schedules.values(0.0)
        followed: set[str] = set()
        for group in optimizer.param_groups:
            wd_name = schedules.weight_decay_schedule_name(group)
            if wd_name is not None:
                group["weight_decay"] = start[wd_name]
                followed.add(wd_name)
        _warn_unused_head_weight_decay(optimizer_config, schedules, followed)
    if use_larc:
        optimizer = build_larc(optimizer, larc_config)
    return optimizer

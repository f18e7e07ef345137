"""``ParamSchedulerSet``: the schedules of a run, and how they reach the optimizer.

``build_param_schedulers`` reads ``OPTIMIZER.param_schedulers.lr`` (and ``lr_head`` when
``head_optimizer_params.use_different_lr`` is true), applies ``auto_lr_scaling`` (see
:mod:`vissl.optimizers.param_scheduler.auto_lr_scaling`), copies ``OPTIMIZER.num_epochs``
into each schedule (as ClassyVision does) and builds fvcore schedulers. Head param groups
(``group["is_head"]``) follow ``lr_head``; without a separate head rate ``lr_head`` is
``lr`` itself, as VISSL's config inference makes it.

An optional ``OPTIMIZER.param_schedulers.weight_decay`` (same scheduler names and
``update_interval`` as ``lr``; ``auto_lr_scaling`` is refused) schedules the weight decay,
as DINO does (cosine 0.04 -> 0.4). As in VISSL, it replaces ``OPTIMIZER.weight_decay`` for
the regularized groups (``trunk_regularized`` and the single group ``all`` of
``construct_single_param_group_only``); ``head_regularized`` follows it too unless
``head_optimizer_params.use_different_wd`` gives the head its own fixed weight decay
(VISSL gives the head its constant ``head_optimizer_params.weight_decay`` there instead).
Unregularized groups (bn / bias / ``non_regularized_parameters``) stay at 0 and groups
without one of these names are left alone. Groups that say so themselves
(``weight_decay_scheduled``: the ``dino``, ``lr_decay`` and ``linear_eval_heads``
constructors) decide instead.

``OPTIMIZER.param_schedulers.weight_decay_head`` (VISSL 0.1.6's, e.g. its ``quick_dino``;
the same kind of schedule) sets the weight decay of the ``default`` constructor's
``head_regularized`` group, whatever ``use_different_wd`` says (VISSL's
``get_optimizer_param_groups``: the schedule replaces ``head_optimizer_params.weight_decay``);
no other group follows it (the ``dino`` constructor's groups and the single group keep
``weight_decay``, as in VISSL). The schedules are functions of ``where``, so a resumed run
gets the same values. Without the keys nothing changes.

``param_schedulers`` is a free-form subtree for config validation: its keys are checked
here, and only ``lr``, ``lr_head``, ``weight_decay`` and ``weight_decay_head`` are
accepted.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from fvcore.common.param_scheduler import ParamScheduler
from torch.optim import Optimizer

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError, UnknownKeyError
from vissl.optimizers._checks import get_bool, get_section
from vissl.optimizers.param_scheduler.auto_lr_scaling import (
    apply_auto_lr_scaling,
    auto_scale_enabled,
)
from vissl.optimizers.param_scheduler.schedulers import (
    UPDATE_INTERVALS,
    build_param_scheduler,
    scheduler_update_interval,
)
from vissl.utils.registry import closest_match

_PATH = "config.OPTIMIZER"
#: the schedules ``OPTIMIZER.param_schedulers`` may hold.
SCHEDULE_NAMES = ("lr", "lr_head", "weight_decay", "weight_decay_head")
#: the weight-decay schedules among them.
WEIGHT_DECAY_SCHEDULES = ("weight_decay", "weight_decay_head")
#: the param group (by ``param_group_name``) that ``weight_decay_head`` sets.
HEAD_WEIGHT_DECAY_GROUP = "head_regularized"
#: param groups (by ``param_group_name``) whose weight decay the ``weight_decay`` schedule
#: sets; ``head_regularized`` too unless the head has its own weight decay.
WEIGHT_DECAY_GROUPS = ("trunk_regularized", "all")
#: largest ``where`` passed to a scheduler: fvcore's schedulers are defined on [0, 1) and
#: add ``WHERE_EPSILON`` before indexing, so 1.0 itself would fail.
MAX_WHERE = 1.0 - 2 * ParamScheduler.WHERE_EPSILON


def clamp_where(where: float) -> float:
    """``where`` limited to ``[0, MAX_WHERE]``; negative values are an error."""
    if where < 0:
        raise ValueError(f"training progress 'where' must be in [0, 1], got {where}.")
    return min(float(where), MAX_WHERE)


class ParamSchedulerSet:
    """The ``lr``, ``lr_head`` and optional ``weight_decay`` / ``weight_decay_head``
    schedules with their intervals.

    Args:
        schedulers: ``{"lr": ..., "lr_head": ..., "weight_decay": ...,
            "weight_decay_head": ...}`` fvcore schedulers (``lr_head`` defaults to ``lr``;
            the weight-decay schedules are optional).
        update_intervals: ``"step"`` or ``"epoch"`` per name.
        configs: the resolved (auto-scaled) scheduler configs, for logging.
        head_follows_weight_decay: whether ``head_regularized`` groups follow the
            ``weight_decay`` schedule (false when ``head_optimizer_params.use_different_wd``
            gives the head a fixed weight decay of its own).
    """

    def __init__(
        self,
        schedulers: Mapping[str, ParamScheduler],
        update_intervals: Mapping[str, str],
        configs: Mapping[str, AttrDict] | None = None,
        *,
        head_follows_weight_decay: bool = True,
    ) -> None:
        if "lr" not in schedulers:
            raise ValueError("a ParamSchedulerSet needs an 'lr' scheduler.")
        unknown = set(schedulers) - set(SCHEDULE_NAMES)
        if unknown:
            raise ValueError(f"unknown schedules {sorted(unknown)}; expected {SCHEDULE_NAMES}.")
        self._schedulers = dict(schedulers)
        self._schedulers.setdefault("lr_head", self._schedulers["lr"])
        self._intervals = dict(update_intervals)
        self._intervals.setdefault("lr_head", self._intervals["lr"])
        for name in self._schedulers:
            interval = self._intervals.get(name)
            if interval not in UPDATE_INTERVALS:
                raise ValueError(f"update interval of {name!r} must be 'step' or 'epoch'.")
        self.configs: dict[str, AttrDict] = dict(configs or {})
        self.head_follows_weight_decay = bool(head_follows_weight_decay)
        #: the schedules :meth:`apply` updates per interval (None: all of them)
        self._due: dict[str | None, frozenset[str]] = {
            interval: frozenset(
                n for n, i in self._intervals.items() if n in self._schedulers and i == interval
            )
            for interval in UPDATE_INTERVALS
        }
        self._due[None] = frozenset(self._schedulers)

    @property
    def names(self) -> list[str]:
        """The schedule names: ``["lr", "lr_head"]``, plus the weight-decay ones set."""
        return list(self._schedulers)

    @property
    def has_weight_decay(self) -> bool:
        """Whether the weight decay is scheduled (``param_schedulers.weight_decay``)."""
        return "weight_decay" in self._schedulers

    @property
    def has_weight_decay_head(self) -> bool:
        """Whether the head's weight decay is scheduled (``param_schedulers.weight_decay_head``)."""
        return "weight_decay_head" in self._schedulers

    def scheduler(self, name: str) -> ParamScheduler:
        """The fvcore scheduler of ``name``."""
        return self._schedulers[name]

    def update_interval(self, name: str) -> str:
        """``"step"`` or ``"epoch"``: when the ``name`` schedule is re-evaluated."""
        return self._intervals[name]

    def values(self, where: float) -> dict[str, float]:
        """Every schedule's value at training progress ``where`` (clamped below 1)."""
        w = clamp_where(where)
        return {name: float(s(w)) for name, s in self._schedulers.items()}

    def group_schedule_name(self, param_group: Mapping[str, Any]) -> str:
        """The schedule a param group follows: ``lr_head`` for head groups, else ``lr``."""
        return "lr_head" if param_group.get("is_head", False) else "lr"

    def follows_weight_decay(self, param_group: Mapping[str, Any]) -> bool:
        """Whether the ``weight_decay`` schedule sets this group's weight decay.

        True for the regularized groups (see the module docstring), by their
        ``param_group_name``, when a weight-decay schedule is set; a group's own
        ``weight_decay_scheduled`` (set by the ``dino``, ``lr_decay`` and
        ``linear_eval_heads`` constructors) decides instead when present.
        """
        return self.weight_decay_schedule_name(param_group) == "weight_decay"

    def weight_decay_schedule_name(self, param_group: Mapping[str, Any]) -> str | None:
        """The schedule that sets this group's weight decay: ``"weight_decay_head"``,
        ``"weight_decay"`` or None (the group keeps its own).

        A group's ``weight_decay_scheduled`` decides when present (``weight_decay``);
        otherwise ``head_regularized`` follows ``weight_decay_head`` when it is set, else
        ``weight_decay`` (unless ``use_different_wd``), and ``trunk_regularized`` / ``all``
        follow ``weight_decay``.
        """
        explicit = param_group.get("weight_decay_scheduled")
        if explicit is not None:
            return "weight_decay" if explicit and self.has_weight_decay else None
        name = param_group.get("param_group_name")
        if name == HEAD_WEIGHT_DECAY_GROUP:
            if self.has_weight_decay_head:
                return "weight_decay_head"
            follows = self.head_follows_weight_decay
        else:
            follows = name in WEIGHT_DECAY_GROUPS
        return "weight_decay" if follows and self.has_weight_decay else None

    def apply(self, optimizer: Optimizer, where: float, interval: str | None) -> None:
        """Set the ``lr`` (and scheduled ``weight_decay``) of the groups due at ``interval``.

        ``param_group["lr"]`` follows the group's learning-rate schedule (times the
        group's ``lr_scale``, 1 when absent: layer-wise decay, per-head rates); the
        ``weight_decay`` of regularized groups follows their weight-decay schedule, if
        any (:meth:`weight_decay_schedule_name`). Each is updated only when its
        schedule's update interval is ``interval``.

        Args:
            optimizer: the optimizer (or LARC wrapper) whose groups are updated.
            where: training progress in ``[0, 1]`` (1.0 is clamped just below 1).
            interval: ``"step"`` or ``"epoch"``; ``None`` updates every group.
        """
        due = self._due.get(interval)
        if due is None:
            raise ValueError(f"interval must be 'step', 'epoch' or None, got {interval!r}.")
        if not due:
            return  # (e.g. every schedule is per epoch and this is a step)
        w = clamp_where(where)
        # Runs every step: each schedule is evaluated at most once, and only if due.
        values: dict[str, float] = {}
        schedule_wd = "weight_decay" in due or "weight_decay_head" in due
        for group in optimizer.param_groups:
            name = self.group_schedule_name(group)
            if name in due:
                lr = values.get(name)
                if lr is None:
                    lr = values[name] = float(self._schedulers[name](w))
                group["lr"] = lr * group.get("lr_scale", 1.0)
            if not schedule_wd:
                continue
            wd_name = self.weight_decay_schedule_name(group)
            if wd_name is not None and wd_name in due:
                wd = values.get(wd_name)
                if wd is None:
                    wd = values[wd_name] = float(self._schedulers[wd_name](w))
                group["weight_decay"] = wd

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{n}={type(s).__name__}@{self._intervals[n]}" for n, s in self._schedulers.items()
        )
        return f"ParamSchedulerSet({parts})"


_LR_VALUE_KEYS = ("value", "start_value", "end_value", "base_value")


def check_non_negative_lr(
    cfg: Mapping[str, Any], key_path: str, *, what: str = "a learning rate"
) -> None:
    """Raise ``ConfigError`` naming the key of any negative value in the schedule ``cfg``.

    ``what`` names the scheduled quantity in the message (``"a weight decay"``).
    """
    for key in _LR_VALUE_KEYS:
        value = cfg.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise ConfigError(
                f"{key_path}.{key} is {what} and must be >= 0, got {value}.",
                f"{key_path}.{key}",
            )
    values = cfg.get("values")
    if isinstance(values, list | tuple):
        for i, value in enumerate(values):
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise ConfigError(
                    f"{key_path}.values[{i}] is {what} and must be >= 0, got {value}.",
                    f"{key_path}.values",
                )
    if cfg.get("name") == "composite" and isinstance(cfg.get("schedulers"), list | tuple):
        for i, sub in enumerate(cfg["schedulers"]):
            if isinstance(sub, Mapping):
                check_non_negative_lr(sub, f"{key_path}.schedulers[{i}]", what=what)


def _build_one(
    sched_cfg: Mapping[str, Any],
    *,
    key_path: str,
    num_epochs: Any,
    batch_size_per_replica: int,
    world_size: int,
    num_nodes: int,
) -> tuple[ParamScheduler, str, AttrDict]:
    resolved = apply_auto_lr_scaling(
        sched_cfg,
        batch_size_per_replica=batch_size_per_replica,
        world_size=world_size,
        num_nodes=num_nodes,
        key_path=key_path,
    )
    if num_epochs is not None:
        resolved["num_epochs"] = num_epochs
    check_non_negative_lr(resolved, key_path)
    scheduler = build_param_scheduler(resolved, key_path=key_path)
    return scheduler, scheduler_update_interval(resolved, key_path), resolved


def _build_weight_decay(
    sched_cfg: Any, *, num_epochs: Any, name: str = "weight_decay"
) -> tuple[ParamScheduler, str, AttrDict] | None:
    """The ``param_schedulers.<name>`` weight-decay schedule (``weight_decay`` or
    ``weight_decay_head``), or None when it is not set."""
    key_path = f"{_PATH}.param_schedulers.{name}"
    if sched_cfg is None or (isinstance(sched_cfg, Mapping) and not sched_cfg):
        return None
    if not isinstance(sched_cfg, Mapping):
        constant = (
            "weight_decay" if name == "weight_decay" else "head_optimizer_params.weight_decay"
        )
        raise ConfigError(
            f"{key_path} must be a scheduler config (e.g. name: cosine, start_value: 0.04, "
            f"end_value: 0.4), got {sched_cfg!r}; a constant weight decay is "
            f"{_PATH}.{constant}.",
            key_path,
        )
    if auto_scale_enabled(sched_cfg, key_path):
        raise ConfigError(
            f"{key_path}.auto_lr_scaling.auto_scale is true: auto_lr_scaling scales learning "
            "rates with the batch size, not weight decay. Set it to false (or leave "
            "auto_lr_scaling out) and give the weight-decay values directly.",
            f"{key_path}.auto_lr_scaling.auto_scale",
        )
    resolved = AttrDict(copy.deepcopy(dict(sched_cfg)))
    if num_epochs is not None:
        resolved["num_epochs"] = num_epochs
    check_non_negative_lr(resolved, key_path, what="a weight decay")
    scheduler = build_param_scheduler(resolved, key_path=key_path)
    return scheduler, scheduler_update_interval(resolved, key_path), resolved


def _check_schedule_names(schedules: Mapping[str, Any]) -> None:
    for name in schedules:
        if name not in SCHEDULE_NAMES:
            close = closest_match(str(name), list(SCHEDULE_NAMES))
            hint = f" Did you mean {close!r}?" if close else ""
            raise UnknownKeyError(
                f"{_PATH}.param_schedulers.{name} is not a schedule vissl knows: "
                f"param_schedulers holds {list(SCHEDULE_NAMES)}.{hint}",
                f"{_PATH}.param_schedulers.{name}",
            )


def build_param_schedulers(
    optimizer_config: Mapping[str, Any],
    *,
    batch_size_per_replica: int,
    world_size: int,
    num_nodes: int = 1,
) -> ParamSchedulerSet:
    """Build the ``lr`` (``lr_head``, ``weight_decay``) schedules of ``config.OPTIMIZER``.

    Args:
        optimizer_config: ``config.OPTIMIZER``.
        batch_size_per_replica: ``DATA.TRAIN.BATCHSIZE_PER_REPLICA`` (for auto scaling).
        world_size: number of training processes (for auto scaling).
        num_nodes: number of machines (VISSL's linear-warmup rule is per node).

    Raises:
        ConfigError: a missing or invalid schedule, or a key of ``param_schedulers`` other
            than ``lr``, ``lr_head``, ``weight_decay`` and ``weight_decay_head``, naming its
            key path.
        UnknownNameError: an unregistered scheduler name.
    """
    schedules = get_section(optimizer_config, "param_schedulers", _PATH)
    _check_schedule_names(schedules)
    lr_cfg = schedules.get("lr")
    if not isinstance(lr_cfg, Mapping) or not lr_cfg:
        raise ConfigError(
            f"{_PATH}.param_schedulers.lr must be a learning-rate scheduler config "
            f"(name: constant | cosine | linear | multistep | ...), got {lr_cfg!r}.",
            f"{_PATH}.param_schedulers.lr",
        )

    def build(sched_cfg: Mapping[str, Any], name: str) -> tuple[ParamScheduler, str, AttrDict]:
        return _build_one(
            sched_cfg,
            key_path=f"{_PATH}.param_schedulers.{name}",
            num_epochs=optimizer_config.get("num_epochs"),
            batch_size_per_replica=batch_size_per_replica,
            world_size=world_size,
            num_nodes=num_nodes,
        )

    lr, lr_interval, lr_resolved = build(lr_cfg, "lr")
    schedulers = {"lr": lr}
    intervals = {"lr": lr_interval}
    configs = {"lr": lr_resolved}

    head = get_section(optimizer_config, "head_optimizer_params", _PATH)
    head_path = f"{_PATH}.head_optimizer_params"
    if get_bool(head, "use_different_lr", head_path):
        head_cfg = schedules.get("lr_head")
        if not isinstance(head_cfg, Mapping) or not head_cfg:
            raise ConfigError(
                f"{_PATH}.head_optimizer_params.use_different_lr is true but "
                f"{_PATH}.param_schedulers.lr_head is not set: give the head's learning-rate "
                "scheduler config.",
                f"{_PATH}.param_schedulers.lr_head",
            )
        schedulers["lr_head"], intervals["lr_head"], configs["lr_head"] = build(head_cfg, "lr_head")
    else:
        schedulers["lr_head"], intervals["lr_head"], configs["lr_head"] = (
            lr,
            lr_interval,
            lr_resolved,
        )

    for wd_name in WEIGHT_DECAY_SCHEDULES:
        built = _build_weight_decay(
            schedules.get(wd_name), num_epochs=optimizer_config.get("num_epochs"), name=wd_name
        )
        if built is not None:
            schedulers[wd_name], intervals[wd_name], configs[wd_name] = built
    return ParamSchedulerSet(
        schedulers,
        intervals,
        configs,
        head_follows_weight_decay=not get_bool(head, "use_different_wd", head_path),
    )

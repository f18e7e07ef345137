"""``ParamSchedulerSet``: the learning-rate schedules of a run, and how they reach the optimizer.

``build_param_schedulers`` reads ``OPTIMIZER.param_schedulers.lr`` (and ``lr_head`` when
``head_optimizer_params.use_different_lr`` is true), applies ``auto_lr_scaling`` (see
:mod:`vissl.optimizers.param_scheduler.auto_lr_scaling`), copies ``OPTIMIZER.num_epochs``
into each schedule (as ClassyVision does) and builds fvcore schedulers. Head param groups
(``group["is_head"]``) follow ``lr_head``; without a separate head rate ``lr_head`` is
``lr`` itself, as VISSL's config inference makes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fvcore.common.param_scheduler import ParamScheduler
from torch.optim import Optimizer

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.optimizers._checks import get_bool, get_section
from vissl.optimizers.param_scheduler.auto_lr_scaling import apply_auto_lr_scaling
from vissl.optimizers.param_scheduler.schedulers import (
    UPDATE_INTERVALS,
    build_param_scheduler,
    scheduler_update_interval,
)

_PATH = "config.OPTIMIZER"
#: largest ``where`` passed to a scheduler: fvcore's schedulers are defined on [0, 1) and
#: add ``WHERE_EPSILON`` before indexing, so 1.0 itself would fail.
MAX_WHERE = 1.0 - 2 * ParamScheduler.WHERE_EPSILON


def clamp_where(where: float) -> float:
    """``where`` limited to ``[0, MAX_WHERE]``; negative values are an error."""
    if where < 0:
        raise ValueError(f"training progress 'where' must be in [0, 1], got {where}.")
    return min(float(where), MAX_WHERE)


class ParamSchedulerSet:
    """The ``lr`` and ``lr_head`` schedules with their update intervals.

    Args:
        schedulers: ``{"lr": ..., "lr_head": ...}`` fvcore schedulers.
        update_intervals: ``"step"`` or ``"epoch"`` per name.
        configs: the resolved (auto-scaled) scheduler configs, for logging.
    """

    def __init__(
        self,
        schedulers: Mapping[str, ParamScheduler],
        update_intervals: Mapping[str, str],
        configs: Mapping[str, AttrDict] | None = None,
    ) -> None:
        if "lr" not in schedulers:
            raise ValueError("a ParamSchedulerSet needs an 'lr' scheduler.")
        self._schedulers = dict(schedulers)
        self._schedulers.setdefault("lr_head", self._schedulers["lr"])
        self._intervals = dict(update_intervals)
        self._intervals.setdefault("lr_head", self._intervals["lr"])
        for name, interval in self._intervals.items():
            if interval not in UPDATE_INTERVALS:
                raise ValueError(f"update interval of {name!r} must be 'step' or 'epoch'.")
        self.configs: dict[str, AttrDict] = dict(configs or {})

    @property
    def names(self) -> list[str]:
        """The schedule names, ``["lr", "lr_head"]``."""
        return list(self._schedulers)

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

    def apply(self, optimizer: Optimizer, where: float, interval: str | None) -> None:
        """Set ``param_group["lr"]`` of the groups whose schedule updates every ``interval``.

        Args:
            optimizer: the optimizer (or LARC wrapper) whose groups are updated.
            where: training progress in ``[0, 1]`` (1.0 is clamped just below 1).
            interval: ``"step"`` or ``"epoch"``; ``None`` updates every group.
        """
        if interval is not None and interval not in UPDATE_INTERVALS:
            raise ValueError(f"interval must be 'step', 'epoch' or None, got {interval!r}.")
        w = clamp_where(where)
        cache: dict[str, float] = {}
        for group in optimizer.param_groups:
            name = self.group_schedule_name(group)
            if interval is not None and self._intervals[name] != interval:
                continue
            if name not in cache:
                cache[name] = float(self._schedulers[name](w))
            group["lr"] = cache[name]

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{n}={type(s).__name__}@{self._intervals[n]}" for n, s in self._schedulers.items()
        )
        return f"ParamSchedulerSet({parts})"


_LR_VALUE_KEYS = ("value", "start_value", "end_value", "base_value")


def check_non_negative_lr(cfg: Mapping[str, Any], key_path: str) -> None:
    """Raise ``ConfigError`` naming the key of any negative learning-rate value in ``cfg``."""
    for key in _LR_VALUE_KEYS:
        value = cfg.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            raise ConfigError(
                f"{key_path}.{key} is a learning rate and must be >= 0, got {value}.",
                f"{key_path}.{key}",
            )
    values = cfg.get("values")
    if isinstance(values, list | tuple):
        for i, value in enumerate(values):
            if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
                raise ConfigError(
                    f"{key_path}.values[{i}] is a learning rate and must be >= 0, got {value}.",
                    f"{key_path}.values",
                )
    if cfg.get("name") == "composite" and isinstance(cfg.get("schedulers"), list | tuple):
        for i, sub in enumerate(cfg["schedulers"]):
            if isinstance(sub, Mapping):
                check_non_negative_lr(sub, f"{key_path}.schedulers[{i}]")


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


def build_param_schedulers(
    optimizer_config: Mapping[str, Any],
    *,
    batch_size_per_replica: int,
    world_size: int,
    num_nodes: int = 1,
) -> ParamSchedulerSet:
    """Build the ``lr`` (and ``lr_head``) schedules of ``config.OPTIMIZER``.

    Args:
        optimizer_config: ``config.OPTIMIZER``.
        batch_size_per_replica: ``DATA.TRAIN.BATCHSIZE_PER_REPLICA`` (for auto scaling).
        world_size: number of training processes (for auto scaling).
        num_nodes: number of machines (VISSL's linear-warmup rule is per node).

    Raises:
        ConfigError: a missing or invalid schedule, naming its key path.
        UnknownNameError: an unregistered scheduler name.
    """
    schedules = get_section(optimizer_config, "param_schedulers", _PATH)
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
    if get_bool(head, "use_different_lr", f"{_PATH}.head_optimizer_params"):
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
    return ParamSchedulerSet(schedulers, intervals, configs)

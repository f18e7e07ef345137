"""Automatic learning-rate scaling with the batch size, as VISSL's ``infer_learning_rate``.

With ``auto_lr_scaling.auto_scale`` true::

    scale_factor = batch_size_per_replica * world_size / base_lr_batch_size
    scale_factor = sqrt(scale_factor)            # if scaling_type == "sqrt"
    scaled_lr    = base_value * scale_factor

and the schedule's values are rewritten (VISSL's ``get_scaled_lr_scheduler``):

* ``cosine`` (and ``cosine_warm_restart``: any name containing "cosine", as VISSL):
  ``end_value = scaled_lr * end_value / start_value``; ``start_value = scaled_lr``
* ``multistep`` / ``step``: ``gamma = round(values[1] / values[0], 6)``;
  ``values[i] = round(scaled_lr * gamma ** i, 8)``
* ``step_with_fixed_gamma``: ``base_value = scaled_lr``
* ``linear``: ``end_value = scaled_lr`` (a warmup towards the scaled rate)
* ``constant``: ``value = scaled_lr``
* ``composite``: each sub-scheduler is rewritten; if one is ``linear`` (a warmup), its
  ``start_value`` becomes ``base_value * batch_size_per_node / base_lr_batch_size``
  (always linear scaling, per node, as VISSL does) and, on a single node, a warmup whose
  start is not below its end is dropped. A composite left with one scheduler becomes
  that scheduler.

Other schedulers (e.g. ``polynomial``) cannot be auto-scaled (VISSL raises too).
One deliberate difference: when a warmup is dropped from a composite of three or more
schedulers, its length is given to the next scheduler (VISSL would leave the lengths
unmatched and fail); with two schedulers this equals VISSL's collapse.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.optimizers._checks import get_bool, get_number, is_number

SCALING_TYPES = ("linear", "sqrt")
SCALABLE_SCHEDULERS = (
    "constant",
    "cosine",
    "cosine_warm_restart",
    "linear",
    "multistep",
    "step",
    "step_with_fixed_gamma",
    "composite",
)


def auto_scale_enabled(sched_cfg: Mapping[str, Any], key_path: str) -> bool:
    """Whether ``sched_cfg.auto_lr_scaling.auto_scale`` is true."""
    auto = sched_cfg.get("auto_lr_scaling") or {}
    if not isinstance(auto, Mapping):
        raise ConfigError(
            f"{key_path}.auto_lr_scaling must be a mapping, got {auto!r}.",
            f"{key_path}.auto_lr_scaling",
        )
    return get_bool(auto, "auto_scale", f"{key_path}.auto_lr_scaling")


def scaled_learning_rate(
    auto_cfg: Mapping[str, Any],
    *,
    batch_size_per_replica: int,
    world_size: int,
    key_path: str,
) -> float:
    """``base_value`` scaled by the global batch size (see the module docstring)."""
    path = f"{key_path}.auto_lr_scaling"
    base_value = get_number(auto_cfg, "base_value", path, min_value=0.0)
    base_batch = get_number(auto_cfg, "base_lr_batch_size", path, min_value=0, min_inclusive=False)
    scaling_type = auto_cfg.get("scaling_type", "linear")
    if scaling_type not in SCALING_TYPES:
        raise ConfigError(
            f"{path}.scaling_type must be one of {list(SCALING_TYPES)}, got {scaling_type!r}.",
            f"{path}.scaling_type",
        )
    scale_factor = float(batch_size_per_replica * world_size) / base_batch
    if scaling_type == "sqrt":
        scale_factor = math.sqrt(scale_factor)
    return base_value * scale_factor


def _rescale(
    cfg: AttrDict,
    scaled_lr: float,
    *,
    auto_cfg: Mapping[str, Any],
    batch_size_per_replica: int,
    world_size: int,
    num_nodes: int,
    key_path: str,
) -> AttrDict:
    name = cfg.get("name")
    if isinstance(name, str) and "cosine" in name:
        start = get_number(cfg, "start_value", key_path)
        end = get_number(cfg, "end_value", key_path)
        if start == 0:
            raise ConfigError(
                f"{key_path}.start_value is 0: a cosine schedule starting at 0 cannot be "
                "auto-scaled (the decay ratio end_value / start_value is undefined).",
                f"{key_path}.start_value",
            )
        cfg["start_value"] = float(scaled_lr)
        cfg["end_value"] = float(scaled_lr * (end / start))
    elif name in ("multistep", "step"):
        values = cfg.get("values")
        if (
            not isinstance(values, list | tuple)
            or not values
            or not all(is_number(v) for v in values)
        ):
            raise ConfigError(
                f"{key_path}.values must be a non-empty list of numbers, got {values!r}.",
                f"{key_path}.values",
            )
        gamma = 1.0
        if len(values) > 1:
            if values[0] == 0:
                raise ConfigError(
                    f"{key_path}.values starts at 0: cannot infer the decay factor to auto-scale.",
                    f"{key_path}.values",
                )
            gamma = round(values[1] / values[0], 6)
        cfg["values"] = [round(float(scaled_lr * gamma**i), 8) for i in range(len(values))]
    elif name == "step_with_fixed_gamma":
        cfg["base_value"] = scaled_lr
    elif name == "linear":
        cfg["end_value"] = scaled_lr
    elif name == "constant":
        cfg["value"] = scaled_lr
    elif name == "composite":
        subs = cfg.get("schedulers")
        if not isinstance(subs, list) or not subs:
            raise ConfigError(
                f"{key_path}.schedulers must be a non-empty list of scheduler configs.",
                f"{key_path}.schedulers",
            )
        has_warmup = False
        for i, sub in enumerate(subs):
            if not isinstance(sub, Mapping):
                raise ConfigError(
                    f"{key_path}.schedulers[{i}] must be a scheduler config, got {sub!r}.",
                    f"{key_path}.schedulers[{i}]",
                )
            sub = sub if isinstance(sub, AttrDict) else AttrDict(sub)
            has_warmup = has_warmup or sub.get("name") == "linear"
            subs[i] = _rescale(
                sub,
                scaled_lr,
                auto_cfg=auto_cfg,
                batch_size_per_replica=batch_size_per_replica,
                world_size=world_size,
                num_nodes=num_nodes,
                key_path=f"{key_path}.schedulers[{i}]",
            )
        if has_warmup:
            _resolve_linear_warmup(
                cfg,
                auto_cfg=auto_cfg,
                batch_size_per_replica=batch_size_per_replica,
                world_size=world_size,
                num_nodes=num_nodes,
            )
    else:
        raise ConfigError(
            f"{key_path}.name is {name!r}, which auto_lr_scaling cannot rescale; it supports "
            f"{list(SCALABLE_SCHEDULERS)}. Set {key_path}.auto_lr_scaling.auto_scale to false "
            "and give the values directly.",
            f"{key_path}.name",
        )
    return cfg


def _resolve_linear_warmup(
    cfg: AttrDict,
    *,
    auto_cfg: Mapping[str, Any],
    batch_size_per_replica: int,
    world_size: int,
    num_nodes: int,
) -> None:
    """VISSL's ``resolve_linear_schedule``: set the warmup start and drop useless warmups."""
    procs_per_node = world_size // num_nodes
    batch_size_per_node = batch_size_per_replica * procs_per_node
    start_value = (
        float(auto_cfg["base_value"]) * batch_size_per_node / auto_cfg["base_lr_batch_size"]
    )
    subs = cfg["schedulers"]
    remove = -1
    for idx, sub in enumerate(subs):
        if sub.get("name") == "linear":
            sub["start_value"] = start_value
            if num_nodes == 1 and start_value <= sub["end_value"]:
                remove = idx
    if remove >= 0:
        del subs[remove]
        lengths = cfg.get("lengths")
        if isinstance(lengths, list) and len(lengths) == len(subs) + 1:
            lengths = [float(x) for x in lengths]
            freed = lengths.pop(remove)
            if lengths:
                lengths[min(remove, len(lengths) - 1)] += freed
            cfg["lengths"] = lengths
        scaling = cfg.get("interval_scaling")
        if isinstance(scaling, list) and len(scaling) == len(subs) + 1:
            cfg["interval_scaling"] = [s for i, s in enumerate(scaling) if i != remove]
    if len(subs) == 1:
        for key, value in subs[0].items():
            cfg[key] = value


def apply_auto_lr_scaling(
    sched_cfg: Mapping[str, Any],
    *,
    batch_size_per_replica: int,
    world_size: int,
    num_nodes: int = 1,
    key_path: str = "config.OPTIMIZER.param_schedulers.lr",
) -> AttrDict:
    """A copy of ``sched_cfg`` with its values scaled to the global batch size.

    Unchanged (but copied) when ``auto_lr_scaling.auto_scale`` is false.

    Args:
        sched_cfg: the learning-rate scheduler config (``param_schedulers.lr`` or ``lr_head``).
        batch_size_per_replica: ``DATA.TRAIN.BATCHSIZE_PER_REPLICA``.
        world_size: number of training processes.
        num_nodes: number of machines (only matters for a composite with linear warmup).
        key_path: where ``sched_cfg`` sits, for error messages.

    Raises:
        ConfigError: invalid scaling settings or a scheduler that cannot be scaled.
    """
    cfg = AttrDict(copy.deepcopy(dict(sched_cfg)))
    if not auto_scale_enabled(cfg, key_path):
        return cfg
    if batch_size_per_replica <= 0 or world_size <= 0 or num_nodes <= 0:
        raise ValueError(
            "auto_lr_scaling needs positive batch_size_per_replica, world_size and num_nodes; "
            f"got {batch_size_per_replica}, {world_size}, {num_nodes}."
        )
    if world_size % num_nodes != 0:
        raise ValueError(f"world_size {world_size} is not a multiple of num_nodes {num_nodes}.")
    auto_cfg = cfg["auto_lr_scaling"]
    scaled_lr = scaled_learning_rate(
        auto_cfg,
        batch_size_per_replica=batch_size_per_replica,
        world_size=world_size,
        key_path=key_path,
    )
    return _rescale(
        cfg,
        scaled_lr,
        auto_cfg=auto_cfg,
        batch_size_per_replica=batch_size_per_replica,
        world_size=world_size,
        num_nodes=num_nodes,
        key_path=key_path,
    )

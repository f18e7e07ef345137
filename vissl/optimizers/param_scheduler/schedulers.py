"""The built-in param schedulers: registered builders of fvcore ``ParamScheduler``s.

Each builder is ``fn(cfg: AttrDict) -> ParamScheduler`` and reads, as ClassyVision's
``from_config`` does:

* ``constant``: ``value``
* ``cosine`` / ``linear``: ``start_value``, ``end_value``
* ``multistep``: ``values``, optional ``milestones`` (epochs), ``num_epochs``
* ``step``: ``values``, ``num_epochs``
* ``step_with_fixed_gamma``: ``base_value``, ``gamma``, ``num_decays``, ``num_epochs``
* ``polynomial``: ``base_value``, ``power``
* ``composite``: ``schedulers`` (list of scheduler configs), ``lengths`` (fractions
  summing to 1), ``interval_scaling`` (``rescaled`` | ``fixed`` per scheduler, default
  ``rescaled``); ``num_epochs`` is passed down to the sub-schedulers.

``num_epochs`` is copied from ``OPTIMIZER.num_epochs`` by :func:`build_param_scheduler`'s
callers. Use :func:`build_param_scheduler` (not the builders directly) to get errors
naming full key paths.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from fvcore.common import param_scheduler as fv

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError, UnknownNameError
from vissl.optimizers._checks import get_number, is_number
from vissl.optimizers.param_scheduler import PARAM_SCHEDULER_REGISTRY, register_param_scheduler
from vissl.utils.registry import closest_match

#: update interval used when a scheduler config gives none (ClassyVision's defaults).
DEFAULT_UPDATE_INTERVALS = {
    "constant": "epoch",
    "cosine": "step",
    "linear": "step",
    "multistep": "epoch",
    "polynomial": "step",
    "step": "epoch",
    "step_with_fixed_gamma": "step",
    "composite": "step",
}
UPDATE_INTERVALS = ("step", "epoch")

_KEY_PATH: ContextVar[str] = ContextVar(
    "vissl_param_scheduler_key_path", default="config.OPTIMIZER.param_schedulers.lr"
)


def current_key_path() -> str:
    """Key path of the scheduler config being built (for error messages)."""
    return _KEY_PATH.get()


@contextlib.contextmanager
def _key_path(path: str) -> Iterator[None]:
    token = _KEY_PATH.set(path)
    try:
        yield
    finally:
        _KEY_PATH.reset(token)


def _num(cfg: Mapping[str, Any], key: str, **bounds: Any) -> float:
    return get_number(cfg, key, current_key_path(), **bounds)


def _values(cfg: Mapping[str, Any], key: str = "values") -> list[float]:
    path = f"{current_key_path()}.{key}"
    values = cfg.get(key)
    if not isinstance(values, list | tuple) or not values or not all(is_number(v) for v in values):
        raise ConfigError(f"{path} must be a non-empty list of numbers, got {values!r}.", path)
    return [float(v) for v in values]


def _positive_int(cfg: Mapping[str, Any], key: str, why: str) -> int:
    path = f"{current_key_path()}.{key}"
    value = cfg.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{path} must be a positive integer ({why}), got {value!r}.", path)
    return value


@register_param_scheduler("constant")
def build_constant(cfg: AttrDict) -> fv.ParamScheduler:
    """``value`` throughout."""
    return fv.ConstantParamScheduler(_num(cfg, "value"))


@register_param_scheduler("cosine")
def build_cosine(cfg: AttrDict) -> fv.ParamScheduler:
    """Half-cosine from ``start_value`` to ``end_value``."""
    return fv.CosineParamScheduler(_num(cfg, "start_value"), _num(cfg, "end_value"))


@register_param_scheduler("linear")
def build_linear(cfg: AttrDict) -> fv.ParamScheduler:
    """Linear from ``start_value`` to ``end_value``."""
    return fv.LinearParamScheduler(_num(cfg, "start_value"), _num(cfg, "end_value"))


@register_param_scheduler("multistep")
def build_multistep(cfg: AttrDict) -> fv.ParamScheduler:
    """``values[i]`` between the ``milestones`` (in epochs) over ``num_epochs``.

    As in ClassyVision/fvcore: with ``num_epochs``, give ``len(values) - 1`` milestones
    (or none: equal steps); without it, ``len(values)`` milestones, the last one the end.
    """
    path = current_key_path()
    values = _values(cfg)
    milestones = cfg.get("milestones") or None  # an empty list means equal steps
    if milestones is not None:
        if not isinstance(milestones, list | tuple) or not all(
            isinstance(m, int) and not isinstance(m, bool) for m in milestones
        ):
            raise ConfigError(
                f"{path}.milestones must be a list of epoch numbers, got {milestones!r}.",
                f"{path}.milestones",
            )
        milestones = list(milestones)
    num_epochs = cfg.get("num_epochs")
    if num_epochs is not None:
        num_epochs = _positive_int(cfg, "num_epochs", "the length of training")
    if num_epochs is None and not milestones:
        raise ConfigError(
            f"{path}: the multistep scheduler needs milestones or num_epochs "
            "(config.OPTIMIZER.num_epochs).",
            f"{path}.milestones",
        )
    if milestones is not None and num_epochs is not None and len(milestones) != len(values) - 1:
        raise ConfigError(
            f"{path}.milestones must have len(values) - 1 = {len(values) - 1} entries "
            f"for {len(values)} values, got {milestones}.",
            f"{path}.milestones",
        )
    if milestones is not None:
        end = num_epochs if num_epochs is not None else (milestones[-1] if milestones else 0)
        inner = milestones if num_epochs is not None else milestones[:-1]
        previous = 0
        for m in inner:
            if m <= previous or m >= end:
                raise ConfigError(
                    f"{path}.milestones must be increasing, > 0 and < num_epochs ({end}); "
                    f"got {milestones}.",
                    f"{path}.milestones",
                )
            previous = m
    try:
        return fv.MultiStepParamScheduler(
            values=values, num_updates=num_epochs, milestones=milestones
        )
    except ValueError as err:
        raise ConfigError(f"{path}: invalid multistep schedule: {err}", path) from err


@register_param_scheduler("step")
def build_step(cfg: AttrDict) -> fv.ParamScheduler:
    """``values`` in equal steps over training."""
    values = _values(cfg)
    num_epochs = _positive_int(cfg, "num_epochs", "config.OPTIMIZER.num_epochs")
    return fv.StepParamScheduler(num_updates=num_epochs, values=values)


@register_param_scheduler("step_with_fixed_gamma")
def build_step_with_fixed_gamma(cfg: AttrDict) -> fv.ParamScheduler:
    """``base_value`` times ``gamma`` after each of ``num_decays`` equal steps."""
    base_value = _num(cfg, "base_value", min_value=0.0, min_inclusive=False)
    gamma = _num(cfg, "gamma", min_value=0.0, min_inclusive=False)
    num_decays = _positive_int(cfg, "num_decays", "the number of decays")
    num_epochs = _positive_int(cfg, "num_epochs", "config.OPTIMIZER.num_epochs")
    return fv.StepWithFixedGammaParamScheduler(
        base_value=base_value, num_decays=num_decays, gamma=gamma, num_updates=num_epochs
    )


@register_param_scheduler("polynomial")
def build_polynomial(cfg: AttrDict) -> fv.ParamScheduler:
    """``base_value * (1 - where) ** power``."""
    return fv.PolynomialDecayParamScheduler(_num(cfg, "base_value"), _num(cfg, "power"))


@register_param_scheduler("composite")
def build_composite(cfg: AttrDict) -> fv.ParamScheduler:
    """Sub-schedulers run one after the other over fractions ``lengths`` of training."""
    path = current_key_path()
    schedulers = cfg.get("schedulers")
    if not isinstance(schedulers, list | tuple) or not schedulers:
        raise ConfigError(
            f"{path}.schedulers must be a non-empty list of scheduler configs, got {schedulers!r}.",
            f"{path}.schedulers",
        )
    lengths = cfg.get("lengths")
    if (
        not isinstance(lengths, list | tuple)
        or len(lengths) != len(schedulers)
        or not all(is_number(x) and x > 0 for x in lengths)
    ):
        raise ConfigError(
            f"{path}.lengths must list one positive fraction of training per scheduler "
            f"({len(schedulers)}), got {lengths!r}.",
            f"{path}.lengths",
        )
    if abs(sum(lengths) - 1.0) >= 1e-3:
        raise ConfigError(
            f"{path}.lengths must sum to 1, got {list(lengths)} (sum {sum(lengths)}).",
            f"{path}.lengths",
        )
    scaling = cfg.get("interval_scaling") or ["rescaled"] * len(schedulers)
    if (
        not isinstance(scaling, list | tuple)
        or len(scaling) != len(schedulers)
        or not all(s in ("rescaled", "fixed") for s in scaling)
    ):
        raise ConfigError(
            f"{path}.interval_scaling must give 'rescaled' or 'fixed' for each of the "
            f"{len(schedulers)} schedulers, got {scaling!r}.",
            f"{path}.interval_scaling",
        )
    built = []
    for i, sub in enumerate(schedulers):
        if not isinstance(sub, Mapping):
            raise ConfigError(
                f"{path}.schedulers[{i}] must be a scheduler config, got {sub!r}.",
                f"{path}.schedulers[{i}]",
            )
        sub_cfg = AttrDict(sub)
        if "num_epochs" in cfg and "num_epochs" not in sub_cfg:
            sub_cfg["num_epochs"] = cfg["num_epochs"]
        built.append(build_param_scheduler(sub_cfg, key_path=f"{path}.schedulers[{i}]"))
    return fv.CompositeParamScheduler(
        schedulers=built,
        lengths=[float(x) for x in lengths],
        interval_scaling=list(scaling),
    )


def scheduler_update_interval(cfg: Mapping[str, Any], key_path: str) -> str:
    """``cfg.update_interval``, or the scheduler's default; ``step`` or ``epoch``."""
    name = cfg.get("name")
    interval = cfg.get("update_interval") or DEFAULT_UPDATE_INTERVALS.get(str(name), "step")
    if interval not in UPDATE_INTERVALS:
        raise ConfigError(
            f"{key_path}.update_interval must be 'step' or 'epoch', got {interval!r}.",
            f"{key_path}.update_interval",
        )
    return interval


def build_param_scheduler(
    cfg: Mapping[str, Any], key_path: str = "config.OPTIMIZER.param_schedulers.lr"
) -> fv.ParamScheduler:
    """Build the scheduler named by ``cfg.name`` from the registry.

    Args:
        cfg: the scheduler config (``name`` plus the builder's keys).
        key_path: where ``cfg`` sits in the config, for error messages.

    Raises:
        UnknownNameError: an unregistered scheduler name.
        ConfigError: invalid scheduler parameters (naming the key path).
    """
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{key_path} must be a scheduler config, got {cfg!r}.", key_path)
    name = cfg.get("name")
    if not isinstance(name, str) or name not in PARAM_SCHEDULER_REGISTRY:
        names = PARAM_SCHEDULER_REGISTRY.names()
        close = closest_match(str(name), names)
        hint = f" Did you mean {close!r}?" if close else ""
        raise UnknownNameError(
            f"Unknown param scheduler {name!r} (set by {key_path}.name).{hint} "
            f"Registered names: {names}. If it is your own plugin, make sure the module "
            "that registers it is imported, e.g. by listing it in config.IMPORTS."
        )
    builder = PARAM_SCHEDULER_REGISTRY.get(name)
    cfg = cfg if isinstance(cfg, AttrDict) else AttrDict(cfg)
    with _key_path(key_path):
        try:
            scheduler = builder(cfg)
        except (ConfigError, UnknownNameError):
            raise
        except (TypeError, ValueError) as err:
            raise ConfigError(
                f"{key_path}: cannot build the {name!r} scheduler: {err}", key_path
            ) from err
    if not isinstance(scheduler, fv.ParamScheduler):
        raise TypeError(
            f"param scheduler builder {name!r} ({PARAM_SCHEDULER_REGISTRY.origin(name)}) "
            f"returned {type(scheduler).__name__}, expected an fvcore ParamScheduler."
        )
    return scheduler

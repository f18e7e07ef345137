"""The built-in param schedulers: registered builders of fvcore ``ParamScheduler``s.

Each builder is ``fn(cfg: AttrDict) -> ParamScheduler`` and reads, as ClassyVision's
``from_config`` does:

* ``constant``: ``value``
* ``cosine`` / ``linear``: ``start_value``, ``end_value``
* ``multistep``: ``values``, optional ``milestones`` (epochs), ``num_epochs``
* ``step``: ``values``, ``num_epochs``
* ``step_with_fixed_gamma``: ``base_value``, ``gamma``, ``num_decays``, ``num_epochs``
* ``polynomial``: ``base_value``, ``power``
* ``cosine_warm_restart`` (VISSL): ``start_value``, ``end_value``,
  ``restart_interval_length``, ``wave_type`` (``half`` | ``full``), ``lr_multiplier``,
  ``is_adaptive`` (see :class:`CosineWarmRestartParamScheduler`)
* ``inverse_sqrt`` (VISSL): ``start_value``, ``warmup_interval_length`` (see
  :class:`InverseSqrtParamScheduler`)
* ``composite``: ``schedulers`` (list of scheduler configs), ``lengths`` (fractions
  summing to 1), ``interval_scaling`` (``rescaled`` | ``fixed`` per scheduler, default
  ``rescaled``); ``num_epochs`` is passed down to the sub-schedulers.

``num_epochs`` is copied from ``OPTIMIZER.num_epochs`` by :func:`build_param_scheduler`'s
callers. Use :func:`build_param_scheduler` (not the builders directly) to get errors
naming full key paths.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from fvcore.common import param_scheduler as fv

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError, UnknownKeyError, UnknownNameError
from vissl.optimizers._checks import get_bool, get_number, is_number
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
    "cosine_warm_restart": "step",
    "inverse_sqrt": "step",
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


#: keys every scheduler config may carry besides its own (read by the caller).
_COMMON_KEYS = ("name", "update_interval", "num_epochs", "auto_lr_scaling")


def _check_keys(cfg: Mapping[str, Any], name: str, keys: tuple[str, ...]) -> None:
    """Raise ``UnknownKeyError`` naming the first key of ``cfg`` that ``name`` does not read."""
    path = current_key_path()
    allowed = (*keys, *_COMMON_KEYS)
    for key in cfg:
        if key not in allowed:
            close = closest_match(str(key), list(allowed))
            hint = f" Did you mean {close!r}?" if close else ""
            raise UnknownKeyError(
                f"{path}.{key} is not a key of the {name!r} scheduler.{hint} "
                f"Its keys: {list(keys)}.",
                f"{path}.{key}",
            )


WAVE_TYPES = ("half", "full")


class CosineWarmRestartParamScheduler(fv.ParamScheduler):
    """Cosine schedule with warm restarts (SGDR, https://arxiv.org/abs/1608.03983), as VISSL.

    Training (``where`` in ``[0, 1)``) is cut into cycles of ``restart_interval_length``,
    restarting at ``where = k * restart_interval_length`` for ``k = 0, 1, ...``; when the
    length does not divide 1 the last cycle is cut short. With ``t`` the fraction of the
    current cycle ``k`` done and ``peak_k`` its starting value::

        half: end_value + (peak_k - end_value) * (1 + cos(pi * t)) / 2       # peak -> end
        full: end_value + (peak_k - end_value) * (1 + cos(2 * pi * t)) / 2   # peak -> end -> peak

    The peak after each restart is one of VISSL's three options:

    * ``lr_multiplier == 1`` and not ``is_adaptive``: every cycle restarts at ``start_value``;
    * ``lr_multiplier != 1``: the peak decays by that factor at each restart,
      ``peak_k = start_value * lr_multiplier ** k``;
    * ``is_adaptive``: the peak follows the plain cosine decay from ``start_value`` to
      ``end_value`` over the whole schedule, ``peak_k = end_value + (start_value -
      end_value) * (1 + cos(pi * k * restart_interval_length)) / 2``, so that the envelope
      of the restarts is the ``cosine`` schedule (VISSL: "the resulting max LR matches the
      original cosine wave LR"). The floor of every cycle stays ``end_value``.

    ``is_adaptive`` and an ``lr_multiplier`` other than 1 are two different rules for the
    same peaks and cannot be combined.

    Args:
        start_value: value at ``where = 0`` (the first peak).
        end_value: value at the end of each half wave (the floor).
        restart_interval_length: fraction of the schedule per cycle, in ``(0, 1]``.
        wave_type: ``"half"`` or ``"full"``.
        lr_multiplier: factor applied to the peak at each restart (> 0).
        is_adaptive: peaks follow the cosine envelope (see above).
    """

    def __init__(
        self,
        start_value: float,
        end_value: float,
        restart_interval_length: float,
        wave_type: str = "half",
        lr_multiplier: float = 1.0,
        is_adaptive: bool = False,
    ) -> None:
        if not 0.0 < restart_interval_length <= 1.0:
            raise ValueError(
                f"restart_interval_length must be in (0, 1], got {restart_interval_length}"
            )
        if wave_type not in WAVE_TYPES:
            raise ValueError(f"wave_type must be one of {list(WAVE_TYPES)}, got {wave_type!r}")
        if lr_multiplier <= 0:
            raise ValueError(f"lr_multiplier must be > 0, got {lr_multiplier}")
        if is_adaptive and lr_multiplier != 1.0:
            raise ValueError("is_adaptive and lr_multiplier != 1 cannot be combined")
        self.start_value = float(start_value)
        self.end_value = float(end_value)
        self.restart_interval_length = float(restart_interval_length)
        self.wave_type = wave_type
        self.lr_multiplier = float(lr_multiplier)
        self.is_adaptive = bool(is_adaptive)
        # Float tolerance so that e.g. 1 / 0.1 gives 10 cycles and 0.3 / 0.1 is cycle 3.
        self.num_cycles = max(1, math.ceil(1.0 / self.restart_interval_length - 1e-9))
        self.peak_values = [self._peak(k) for k in range(self.num_cycles)]

    def _peak(self, k: int) -> float:
        if self.is_adaptive:
            where = k * self.restart_interval_length
            return self.end_value + 0.5 * (self.start_value - self.end_value) * (
                1.0 + math.cos(math.pi * where)
            )
        return self.start_value * self.lr_multiplier**k

    def cycle(self, where: float) -> tuple[int, float]:
        """``(k, t)``: the cycle ``where`` falls in and the fraction of it done."""
        position = where / self.restart_interval_length
        k = min(max(math.floor(position + 1e-9), 0), self.num_cycles - 1)
        return k, min(max(position - k, 0.0), 1.0)

    def __call__(self, where: float) -> float:
        k, t = self.cycle(where)
        angle = math.pi * t if self.wave_type == "half" else 2.0 * math.pi * t
        peak = self.peak_values[k]
        return self.end_value + 0.5 * (peak - self.end_value) * (1.0 + math.cos(angle))


class InverseSqrtParamScheduler(fv.ParamScheduler):
    """Linear warmup, then decay with the inverse square root of progress, as VISSL.

    The schedule of Transformers (Vaswani et al., fairseq's ``inverse_sqrt``) with
    ``where`` in place of the update number; with ``w = warmup_interval_length``::

        where <  w:  start_value * where / w           # linear warmup from 0
        where >= w:  start_value * sqrt(w / where)     # = decay_factor / sqrt(where)

    where ``decay_factor = start_value * sqrt(w)``, so the two parts meet at
    ``start_value`` when ``where = w``.

    Args:
        start_value: the value reached at the end of the warmup (the largest value).
        warmup_interval_length: fraction of the schedule spent warming up, in ``(0, 1]``.
    """

    def __init__(self, start_value: float, warmup_interval_length: float) -> None:
        if not 0.0 < warmup_interval_length <= 1.0:
            raise ValueError(
                f"warmup_interval_length must be in (0, 1], got {warmup_interval_length}"
            )
        self.start_value = float(start_value)
        self.warmup_interval_length = float(warmup_interval_length)
        self.decay_factor = self.start_value * math.sqrt(self.warmup_interval_length)

    def __call__(self, where: float) -> float:
        if where < self.warmup_interval_length:
            return self.start_value * where / self.warmup_interval_length
        return self.decay_factor / math.sqrt(where)


@register_param_scheduler("cosine_warm_restart")
def build_cosine_warm_restart(cfg: AttrDict) -> fv.ParamScheduler:
    """VISSL's cosine with warm restarts (see :class:`CosineWarmRestartParamScheduler`)."""
    path = current_key_path()
    _check_keys(
        cfg,
        "cosine_warm_restart",
        (
            "start_value",
            "end_value",
            "restart_interval_length",
            "wave_type",
            "lr_multiplier",
            "is_adaptive",
        ),
    )
    start_value = _num(cfg, "start_value")
    end_value = _num(cfg, "end_value")
    length = _num(cfg, "restart_interval_length", min_value=0.0, min_inclusive=False, max_value=1.0)
    wave_type = cfg.get("wave_type", "half")
    if wave_type not in WAVE_TYPES:
        raise ConfigError(
            f"{path}.wave_type must be 'half' (each cycle goes start -> end) or 'full' "
            f"(start -> end -> start), got {wave_type!r}.",
            f"{path}.wave_type",
        )
    lr_multiplier = _num(cfg, "lr_multiplier", default=1.0, min_value=0.0, min_inclusive=False)
    is_adaptive = get_bool(cfg, "is_adaptive", path)
    if is_adaptive and lr_multiplier != 1.0:
        raise ConfigError(
            f"{path}.lr_multiplier is {lr_multiplier} while is_adaptive is true; they are two "
            "rules for the value after a restart (follow the cosine envelope, or multiply "
            "by lr_multiplier). Set lr_multiplier to 1.0 or is_adaptive to false.",
            f"{path}.lr_multiplier",
        )
    return CosineWarmRestartParamScheduler(
        start_value=start_value,
        end_value=end_value,
        restart_interval_length=length,
        wave_type=wave_type,
        lr_multiplier=lr_multiplier,
        is_adaptive=is_adaptive,
    )


@register_param_scheduler("inverse_sqrt")
def build_inverse_sqrt(cfg: AttrDict) -> fv.ParamScheduler:
    """VISSL's inverse square root decay (see :class:`InverseSqrtParamScheduler`)."""
    _check_keys(cfg, "inverse_sqrt", ("start_value", "warmup_interval_length"))
    start_value = _num(cfg, "start_value")
    warmup = _num(cfg, "warmup_interval_length", min_value=0.0, min_inclusive=False, max_value=1.0)
    return InverseSqrtParamScheduler(start_value=start_value, warmup_interval_length=warmup)


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

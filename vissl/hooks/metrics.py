"""The per-phase metrics, under the names ``metrics.json`` logs them.

:class:`~vissl.hooks.checkpoint_hooks.LogMetricsHook` writes one record per phase::

    {"iteration": 8, "phase_idx": 3, "train_phase_idx": 1, "test_loss": 2.31,
     "test_accuracy_list_meter": {"top_1": {"0": 56.25}, "top_5": {"0": 93.75}}}

Hooks that compare metrics (early stopping, the end-of-training summary) use the record
*flattened* to scalars (:func:`flatten_metrics`): nested keys joined by ``_``, and the
output key left out when a meter has a single output::

    {"test_loss": 2.31, "test_accuracy_list_meter_top_1": 56.25,
     "test_accuracy_list_meter_top_5": 93.75}

A meter with several outputs keeps them: ``test_accuracy_list_meter_top_1_0``,
``..._top_1_1`` (or the ``meter_names`` given in its config).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

#: Keys of a metrics record that count progress rather than measure the model.
COUNTER_KEYS = ("iteration", "phase_idx", "train_phase_idx")


def plain(value: Any) -> Any:
    """Meter values to JSON-able values (tensors to floats, keys to str)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        return float(value.item())
    return value


def phase_split(task: SelfSupervisionTask) -> str:
    """``"train"`` or ``"test"``: the prefix of the current phase's metric names."""
    return "train" if task.train else "test"


def phase_metrics(task: SelfSupervisionTask) -> dict[str, Any]:
    """The ``metrics.json`` record of the phase that just ended (reads the device).

    Call it at phase end, after the meters were synced across ranks.
    """
    split = phase_split(task)
    record: dict[str, Any] = {
        "iteration": task.iteration,
        "phase_idx": task.phase_idx,
        "train_phase_idx": task.train_phase_idx,
        f"{split}_loss": task.phase_average_loss(),
    }
    for meter in task.meters:
        record[f"{split}_{meter.name}"] = plain(meter.value)
    return record


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _flatten(name: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, Mapping):
        if len(value) == 1 and _is_number(next(iter(value.values()))):
            out[name] = float(next(iter(value.values())))  # a single output: no suffix
            return
        for key, sub in value.items():
            _flatten(f"{name}_{key}", sub, out)
    elif isinstance(value, list | tuple):
        for i, sub in enumerate(value):
            _flatten(f"{name}_{i}", sub, out)
    elif _is_number(value):
        out[name] = float(value)


def flatten_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """A ``metrics.json`` record as ``{name: float}``, without the counters.

    Non-numeric values (strings, None) are left out.
    """
    out: dict[str, float] = {}
    for key, value in record.items():
        if key not in COUNTER_KEYS:
            _flatten(key, value, out)
    return out


def logged_metric_names(task: SelfSupervisionTask) -> tuple[list[str], bool]:
    """The flattened names this run will log, known before the first phase.

    From the phases (train and/or test), the loss and the meters' value layout (read from
    the fresh meters), plus the ``test_ema_*`` meters of ``HOOKS.EMA_MODEL.ENABLE_EMA_METERS``.

    Returns:
        ``(sorted names, complete)``; ``complete`` is False when a meter could not report
        its layout before seeing data (its names appear only at the first phase end).
    """
    splits = []
    if any(p["train"] for p in task.phases):
        splits.append("train")
    if not all(p["train"] for p in task.phases):
        splits.append("test")
    ema = False
    try:
        ema = bool(task.config.HOOKS.EMA_MODEL.ENABLE_EMA_METERS)
    except (AttributeError, KeyError):
        pass
    names: dict[str, float] = {}
    complete = True
    layouts: list[tuple[str, Any]] = []
    for meter in task.meters:
        try:
            value = plain(meter.value)
        except Exception:  # a meter that cannot report before it has seen data
            complete = False
            continue
        probe: dict[str, float] = {}
        _flatten("m", value, probe)
        complete = complete and bool(probe)  # no numbers yet: names unknown until data
        layouts.append((str(meter.name), value))
    for split in splits:
        names[f"{split}_loss"] = 0.0
        for meter_name, value in layouts:
            _flatten(f"{split}_{meter_name}", value, names)
            if split == "test" and ema:
                _flatten(f"test_ema_{meter_name}", value, names)
    return sorted(names), complete


def is_finite(value: float) -> bool:
    return math.isfinite(value)


__all__ = [
    "COUNTER_KEYS",
    "flatten_metrics",
    "is_finite",
    "logged_metric_names",
    "phase_metrics",
    "phase_split",
    "plain",
]

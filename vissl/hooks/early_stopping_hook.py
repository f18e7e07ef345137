"""Early stopping: end training when a logged metric stops improving (HOOKS.EARLY_STOPPING).

The monitored name is one of the flattened ``metrics.json`` names (see
:mod:`vissl.hooks.metrics`): ``test_loss``, ``train_loss``,
``test_accuracy_list_meter_top_1``... A ``test_*`` name is checked after each test
phase, a ``train_*`` name after each train phase. After ``PATIENCE`` such phases in a row
without an improvement larger than ``MIN_DELTA`` over the best value, the hook asks the
trainer to stop (``task.request_stop(..., kind="early_stop")``): every rank agrees on the
stop at that phase end and training ends normally (exit code 0), with ``end_reason``
``"early_stop"``.

A checkpoint holds the newest weights when training stops: a train phase's checkpoint is
written by the checkpoint hook or the trainer; when the stop comes after a test phase and
the train phase before it was not saved (``CHECKPOINT_FREQUENCY`` > 1), this hook writes
``model_phase{N}.torch`` itself. Its state (best value, bad phases) is saved in
checkpoints, so a resumed run continues counting where it was.
"""

from __future__ import annotations

import logging
import math
import os
from typing import TYPE_CHECKING, Any

import torch

from vissl.errors import ConfigError
from vissl.hooks.base import Priority, VisslHook
from vissl.hooks.metrics import (
    flatten_metrics,
    is_finite,
    logged_metric_names,
    phase_metrics,
    phase_split,
)
from vissl.utils.distributed import get_world_size, is_primary

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)

KEY = "config.HOOKS.EARLY_STOPPING"
MODES = ("min", "max")


class EarlyStoppingHook(VisslHook):
    """Stops training when ``monitor`` has not improved for ``patience`` monitored phases.

    Args:
        monitor: a flattened ``metrics.json`` name, ``train_*`` or ``test_*``.
        mode: ``"min"`` (a loss) or ``"max"`` (an accuracy).
        patience: monitored phases in a row without improvement before stopping (>= 1).
        min_delta: an improvement must beat the best value by more than this (>= 0).

    Raises:
        ConfigError: an invalid argument, naming its ``HOOKS.EARLY_STOPPING`` key; at
            ``on_start``, a ``monitor`` the run never logs, listing the names it logs.
    """

    # After LogMetricsHook (NORMAL) wrote the phase's record, before the checkpoint hook.
    priority = Priority.LOW + 5

    def __init__(
        self, monitor: str, mode: str = "min", patience: int = 3, min_delta: float = 0.0
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ConfigError(
                f"{KEY}.MONITOR must name a logged metric (e.g. test_loss), got {monitor!r}.",
                f"{KEY}.MONITOR",
            )
        if mode not in MODES:
            raise ConfigError(
                f"{KEY}.MODE={mode!r} is not one of {list(MODES)}: min for a loss, max for an "
                "accuracy.",
                f"{KEY}.MODE",
            )
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ConfigError(
                f"{KEY}.PATIENCE={patience!r} must be an integer >= 1 (monitored phases "
                "without improvement before training stops).",
                f"{KEY}.PATIENCE",
            )
        if (
            isinstance(min_delta, bool)
            or not isinstance(min_delta, int | float)
            or not min_delta >= 0
        ):
            raise ConfigError(
                f"{KEY}.MIN_DELTA={min_delta!r} must be a number >= 0.", f"{KEY}.MIN_DELTA"
            )
        self.monitor = monitor
        self.mode = mode
        self.patience = int(patience)
        self.min_delta = float(min_delta)
        self.best: float | None = None
        self.best_phase_idx = -1
        self.best_train_phase_idx = -1
        self.bad_phases = 0
        self.last_value: float | None = None
        self.stopped_phase_idx = -1
        self._last_train_phase_idx = -1  # phase_idx of the last train phase run here

    @classmethod
    def from_config(cls, cfg: Any) -> EarlyStoppingHook:
        """Build from the ``config`` section (``HOOKS.EARLY_STOPPING``)."""
        es = cfg.HOOKS.EARLY_STOPPING
        return cls(monitor=es.MONITOR, mode=es.MODE, patience=es.PATIENCE, min_delta=es.MIN_DELTA)

    @property
    def split(self) -> str:
        """``"train"`` or ``"test"``: the kind of phase after which ``monitor`` is checked."""
        return self.monitor.split("_", 1)[0]

    # ------------------------------------------------------------------ names
    def _unknown(self, names: list[str], why: str = "") -> ConfigError:
        return ConfigError(
            f"{KEY}.MONITOR={self.monitor!r} is never logged by this run{why}; the logged "
            f"names are: {', '.join(names) or '(none)'}.",
            f"{KEY}.MONITOR",
        )

    def on_start(self, task: SelfSupervisionTask) -> None:
        names, complete = logged_metric_names(task)
        if self.monitor in names:
            return
        if self.split in ("train", "test") and not any(
            n.startswith(f"{self.split}_") for n in names
        ):
            raise self._unknown(names, f" (it has no {self.split} phases)")
        if complete or self.split not in ("train", "test"):
            raise self._unknown(names)
        # A meter could not tell its names before seeing data: checked at the first phase end.

    # ------------------------------------------------------------------ decision
    def _improved(self, value: float) -> bool:
        if not is_finite(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    @staticmethod
    def _rank0_value(value: float, task: SelfSupervisionTask) -> float:
        """Rank 0's value on every rank, so that every rank decides (and saves) the same.

        Synced meters and the rank-averaged loss are equal on every rank already; this
        guards against a meter that is not synced.
        """
        if get_world_size() == 1:
            return value
        import torch.distributed as dist

        device = task.device if dist.get_backend() == "nccl" else torch.device("cpu")
        buf = torch.tensor([value], dtype=torch.float64, device=device)
        dist.broadcast(buf, src=0)
        return float(buf.item())

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        if task.train:
            self._last_train_phase_idx = task.phase_idx

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        if phase_split(task) != self.split:
            return
        metrics = flatten_metrics(phase_metrics(task))
        if self.monitor not in metrics:
            raise self._unknown(sorted(metrics))
        value = self._rank0_value(metrics[self.monitor], task)
        self.last_value = value
        if self._improved(value):
            self.best = value
            self.best_phase_idx = task.phase_idx
            self.best_train_phase_idx = task.train_phase_idx
            self.bad_phases = 0
        else:
            self.bad_phases += 1
        best = (
            "none"
            if self.best is None
            else f"{self.best:.6g} (phase {self.best_phase_idx + 1}/{len(task.phases)})"
        )
        if not is_finite(value) and is_primary():
            logger.warning(
                "early stopping: %s is %s (counted as no improvement)", self.monitor, value
            )
        if self.bad_phases < self.patience:
            if is_primary():
                logger.info(
                    "early stopping: %s = %.6g, best %s, %d/%d phases without improvement",
                    self.monitor,
                    value,
                    best,
                    self.bad_phases,
                    self.patience,
                )
            return
        reason = (
            f"early stopping: {self.monitor} = {value:.6g} has not improved on the best "
            f"{best} by more than MIN_DELTA={self.min_delta:g} ({self.mode}) for "
            f"{self.bad_phases} {phase_split(task)} phase(s) (PATIENCE={self.patience})"
        )
        if task.phase_idx + 1 >= len(task.phases):
            if is_primary():
                logger.info("%s; this was the last phase anyway", reason)
            return
        self.stopped_phase_idx = task.phase_idx
        if is_primary():
            logger.info(
                "%s; stopping training after phase %d/%d",
                reason,
                task.phase_idx + 1,
                len(task.phases),
            )
        request_stop = getattr(task, "request_stop", None)
        if callable(request_stop):
            request_stop(reason, kind="early_stop")
        else:  # before SelfSupervisionTask.request_stop existed
            task.stop_training = True
            task.stop_training_reason = task.stop_training_reason or reason
        if not task.train and not self._newest_weights_saved(task):
            self._save_checkpoint(task)

    # ------------------------------------------------------------------ checkpoint
    def _newest_weights_saved(self, task: SelfSupervisionTask) -> bool:
        """Whether a checkpoint holds the weights of the last train phase run here."""
        p = self._last_train_phase_idx
        if p < 0:
            return True  # no training since the run started (or resumed): nothing new
        names = {os.path.basename(path) for path in task.checkpoints_written}
        return bool(
            names
            & {
                f"model_phase{p}.torch",
                f"model_final_checkpoint_phase{p}.torch",
                f"model_iteration{task.iteration}.torch",
                f"model_phase{task.phase_idx}.torch",
            }
        )

    def _save_checkpoint(self, task: SelfSupervisionTask) -> None:
        keep_last = -1
        try:
            keep_last = int(task.config.CHECKPOINT.KEEP_LAST_N_CHECKPOINTS)
        except (AttributeError, KeyError, TypeError):
            pass
        path = task.save_checkpoint(f"model_phase{task.phase_idx}.torch", True, keep_last)
        if path and is_primary():
            logger.info("early stopping: saved %s", path)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "mode": self.mode,
            "best": self.best,
            "best_phase_idx": self.best_phase_idx,
            "best_train_phase_idx": self.best_train_phase_idx,
            "bad_phases": self.bad_phases,
            "last_value": self.last_value,
            "stopped_phase_idx": self.stopped_phase_idx,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("monitor") != self.monitor or state.get("mode") != self.mode:
            logger.warning(
                "early stopping: the checkpoint monitored %s (%s), this run %s (%s): "
                "counting starts afresh.",
                state.get("monitor"),
                state.get("mode"),
                self.monitor,
                self.mode,
            )
            return
        best = state.get("best")
        self.best = (
            None if best is None or (isinstance(best, float) and math.isnan(best)) else float(best)
        )
        self.best_phase_idx = int(state.get("best_phase_idx", -1))
        self.best_train_phase_idx = int(state.get("best_train_phase_idx", -1))
        self.bad_phases = int(state.get("bad_phases", 0))
        last = state.get("last_value")
        self.last_value = None if last is None else float(last)
        self.stopped_phase_idx = int(state.get("stopped_phase_idx", -1))


__all__ = ["EarlyStoppingHook"]

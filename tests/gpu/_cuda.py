"""Shared pieces of the CUDA suite: overrides, a crash-and-resume run, a sync count."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from tests.integration._runs import run_config
from tests.integration.test_exact_resume import assert_same, crash_generator, final_weights
from vissl.hooks import VisslHook, default_hook_generator

CUDA = ["config.MACHINE.DEVICE=gpu", "config.DISTRIBUTED.BACKEND=nccl"]
PRECISION_BF16 = [
    "config.MODEL.AMP_PARAMS.USE_AMP=True",
    "config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16",
]
PRECISION_FP16 = [
    "config.MODEL.AMP_PARAMS.USE_AMP=True",
    "config.MODEL.AMP_PARAMS.AMP_DTYPE=float16",
]


class SyncCounter(VisslHook):
    """Counts the synchronizing CUDA calls made between two ``on_step`` events."""

    priority = 10_000  # last

    def __init__(self) -> None:
        self.per_step: list[tuple[int, bool, int, list[str]]] = []
        self._catcher = None
        self._log = None

    def _start(self) -> None:
        self._catcher = warnings.catch_warnings(record=True)
        self._log = self._catcher.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")

    def _stop(self) -> list[str]:
        torch.cuda.set_sync_debug_mode(0)
        log = self._log or []
        self._catcher.__exit__(None, None, None)
        self._catcher = None
        return [str(w.message)[:200] for w in log if "synchroniz" in str(w.message)]

    def on_phase_start(self, task) -> None:
        self._start()

    def on_step(self, task) -> None:
        syncs = self._stop()
        self.per_step.append((task.iteration, task.is_log_iteration, len(syncs), syncs))
        self._start()

    def on_phase_end(self, task) -> None:
        if self._catcher is not None:
            self._stop()

    def on_exception(self, task) -> None:
        if self._catcher is not None:
            self._stop()


def crash_and_resume_bitwise(config: str, tmp_path: Any, crash_at: int, *overrides: str) -> None:
    """Train uninterrupted; train again, crashing after ``crash_at``; resume; the final
    weights must be bitwise equal (deterministic cudnn)."""
    common = [
        *CUDA,
        *overrides,
        "config.REPRODUCIBILITY.CUDDN_DETERMINISTIC=True",
        "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
        "config.CHECKPOINT.AUTO_RESUME=True",
    ]
    run_config(config, *common, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            config,
            *common,
            f"config.CHECKPOINT.DIR={crashed}",
            hook_generator=crash_generator(crash_at),
        )
    run_config(config, *common, f"config.CHECKPOINT.DIR={crashed}")
    assert_same(final_weights(tmp_path / "full"), final_weights(crashed))


def syncs_between_log_steps(config: str, tmp_path: Any, *overrides: str) -> list[tuple]:
    """Train ``config`` on CUDA with a single log step; the steps with host syncs, as
    (iteration, count, messages)."""
    counter = SyncCounter()
    run_config(
        config,
        *CUDA,
        *overrides,
        "config.LOG_FREQUENCY=1000",
        f"config.CHECKPOINT.DIR={tmp_path}",
        hook_generator=lambda cfg: [*default_hook_generator(cfg), counter],
    )
    quiet = [(it, n, s) for it, log, n, s in counter.per_step if not log]
    assert quiet, "no step between log steps"
    return [(it, n, s) for it, n, s in quiet if n]

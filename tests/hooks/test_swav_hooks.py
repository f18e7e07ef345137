"""SwAVTrackingHook's collapse warning: a train phase whose mean loss sits at ln K (uniform
codes) is reported as collapsed; a loss away from ln K, or a test phase, is not."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

from vissl.hooks.swav_hooks import SwAVTrackingHook


def _task(mean_loss: float, train: bool = True, protos: int = 50) -> SimpleNamespace:
    loss = SimpleNamespace(uniform_loss=math.log(protos))
    return SimpleNamespace(
        loss=loss, train=train, phase_idx=3, phase_average_loss=lambda: mean_loss
    )


def _warnings(caplog, task: SimpleNamespace) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vissl.hooks.swav_hooks"):
        SwAVTrackingHook().on_phase_end(task)
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_loss_at_ln_k_is_reported_as_collapsed(caplog) -> None:
    (msg,) = _warnings(caplog, _task(math.log(50) + 1e-4))
    assert "collapsed" in msg and "ln K = 3.9120" in msg and "phase 3" in msg
    assert "epsilon" in msg  # says what to try


@pytest.mark.parametrize(
    "task",
    [
        _task(math.log(50) - 0.3),  # learning: below ln K
        _task(math.log(50), train=False),  # test phases are not checked
        _task(float("nan")),  # a NaN loss is CheckNanLossHook's business
    ],
)
def test_no_warning_otherwise(caplog, task) -> None:
    assert _warnings(caplog, task) == []

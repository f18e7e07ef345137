"""quick_simclr_cosine_warm_restart end to end: the logged lr follows warm-up + SGDR."""

from __future__ import annotations

import math

import pytest
import torch

from tests.integration._runs import read_jsonl, run_config

CONFIG = "test/integration_test/quick_simclr_cosine_warm_restart"
STEPS = 8  # DATA_LIMIT 16 / batch 4 = 4 steps per epoch, 2 epochs


def _expected_lr(step: int) -> float:
    """The config's schedule at the start of optimizer step ``step`` (0-based).

    composite: linear 0 -> 0.1 over the first quarter, then a half-cosine from the peak
    to 0.001 restarting half way through the remaining three quarters, the peak halved.
    """
    where = step / STEPS
    if where < 0.25:
        return 0.1 * where / 0.25
    local = (where - 0.25) / 0.75
    cycle = 0 if local < 0.5 else 1
    t = (local - 0.5 * cycle) / 0.5
    peak = 0.1 * 0.5**cycle
    return 0.001 + 0.5 * (peak - 0.001) * (1 + math.cos(math.pi * t))


@pytest.fixture
def one_thread():
    # A model this small runs fastest on one thread; on a loaded machine two threads
    # contend (about 1 s instead of 30 s for this run, measured under load).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.integration
def test_quick_simclr_cosine_warm_restart_logs_the_schedule(tmp_path, one_thread):
    task = run_config(CONFIG, f"config.CHECKPOINT.DIR={tmp_path}")
    assert task.iteration == STEPS
    assert math.isfinite(task.phase_average_loss())
    records = [r for r in read_jsonl(str(tmp_path / "stdout.json")) if r["train"]]
    # LOG_FREQUENCY 1: one record per step; iteration counts the steps done, so record
    # n logs the lr the n-th step (0-based n - 1) used.
    assert [r["iteration"] for r in records] == list(range(1, STEPS + 1))
    logged = [r["lr"] for r in records]
    expected = [_expected_lr(n - 1) for n in range(1, STEPS + 1)]
    assert logged == pytest.approx(expected, abs=1e-9)
    # the warm restart is visible: the lr rises again after decaying
    assert logged[4] < logged[5] == pytest.approx(0.05)
    assert all(math.isfinite(r["loss"]) for r in records)

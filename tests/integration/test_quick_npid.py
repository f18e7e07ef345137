"""NPID end to end: the quick config runs unchanged through the CLI (the memory bank sized
from the data set, every entry written in the first epoch, Z estimated once); a crash plus
auto-resume ends bitwise equal to an uninterrupted run, memory bank and Z included."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.integration._runs import crash_and_resume_states, read_jsonl
from tests.integration.test_quick_dino_barlow import final_state, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

NAME = "quick_npid"
QUICK = "test/integration_test/" + NAME


def test_quick_npid_runs_unchanged_and_writes_every_bank_entry(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / NAME
    state = final_state(folder)
    memory = state["loss.memory"]
    assert memory.shape == (24, 32)  # DATA_LIMIT entries of the head's width
    torch.testing.assert_close(memory.norm(dim=1), torch.ones(24))
    # the bank starts from a fixed draw: every entry has moved away from it
    from vissl.losses.nce_loss import NCELossWithMemory

    start = NCELossWithMemory(num_train_samples=24, embedding_dim=32).memory
    assert ((memory - start).norm(dim=1) > 1e-3).all()
    assert state["loss.norm_constant"].item() > 0
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in records)


RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 6 steps per phase, 12 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=4",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


def test_crash_and_resume_is_bitwise_exact_with_the_memory_bank(tmp_path: Path) -> None:
    full, _ = crash_and_resume_states(
        tmp_path, QUICK, RESUME, crash_after=10, checkpoint_at=8, last=12
    )
    assert "loss.memory" in full and "loss.norm_constant" in full

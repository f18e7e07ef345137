"""Colorization end to end: the quick config runs unchanged through the CLI (Lab input,
262 bins per pixel of the conv5 map, the prior counted over every training pixel and
saved with the loss); a crash plus auto-resume ends bitwise equal to an uninterrupted run
(the counted prior included)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.integration._runs import crash_and_resume_states, read_jsonl
from tests.integration.test_quick_dino_barlow import final_state, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

NAME = "quick_colorization"
QUICK = "test/integration_test/" + NAME


def test_quick_colorization_runs_unchanged_and_counts_the_prior(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / NAME
    state = final_state(folder)
    assert state["heads.0.clf.0.weight"].shape == (262, 256, 1, 1)  # a 1x1 conv per bin
    assert state["trunk._feature_blocks.0.0.weight"].shape == (96, 1, 11, 11)  # L only
    # 4 steps of 8 images, a 3 x 3 conv5 map each: every training pixel counted once
    assert float(state["loss.counts"].sum()) == 4 * 8 * 3 * 3
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in records)


RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 4 steps per phase, 8 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


@pytest.mark.slow
def test_crash_and_resume_is_bitwise_exact(tmp_path: Path) -> None:
    _, resumed = crash_and_resume_states(
        tmp_path, QUICK, RESUME, crash_after=7, checkpoint_at=6, last=8
    )
    assert float(resumed["loss.counts"].sum()) == 8 * 4 * 3 * 3

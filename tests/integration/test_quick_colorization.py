"""Colorization end to end: the quick config runs unchanged through the CLI (Lab input,
262 bins per pixel of the conv5 map, the prior counted over every training pixel and
saved with the loss); a crash plus auto-resume ends bitwise equal to an uninterrupted run
(the counted prior included)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.integration._runs import read_jsonl, run_config
from tests.integration.test_exact_resume import crash_generator
from tests.integration.test_quick_dino_barlow import final_state, run_cli
from tests.integration.test_quick_vicreg import assert_bitwise_equal

pytestmark = pytest.mark.integration

NAME = "quick_colorization"
QUICK = "test/integration_test/" + NAME


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


def test_crash_and_resume_is_bitwise_exact(tmp_path: Path) -> None:
    full = tmp_path / "full"
    run_config(QUICK, *RESUME, f"config.CHECKPOINT.DIR={full}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            QUICK, *RESUME, f"config.CHECKPOINT.DIR={crashed}", hook_generator=crash_generator(7)
        )
    run_config(QUICK, *RESUME, f"config.CHECKPOINT.DIR={crashed}")
    assert "resumed inside phase" in (crashed / "log.txt").read_text()
    resumed_state = final_state(crashed)
    assert_bitwise_equal(final_state(full), resumed_state)
    assert float(resumed_state["loss.counts"].sum()) == 8 * 4 * 3 * 3
    expected = {r["iteration"]: r["loss"] for r in read_jsonl(str(full / "stdout.json"))}
    resumed = [r for r in read_jsonl(str(crashed / "stdout.json")) if r["iteration"] > 6]
    assert [r["iteration"] for r in resumed][-2:] == [7, 8]
    assert all(r["loss"] == expected[r["iteration"]] for r in resumed)

"""Jigsaw end to end: the quick config runs unchanged through the CLI (9 patches of each
image through the trunk, 100 permutation logits per image, the permutation accuracy
logged); a crash plus auto-resume ends bitwise equal to an uninterrupted run (the patch
offsets and permutations of a resumed step are drawn from the same per-sample seeds)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.integration._runs import crash_and_resume_states, read_jsonl
from tests.integration.test_quick_dino_barlow import final_state, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

NAME = "quick_jigsaw"
QUICK = "test/integration_test/" + NAME


def test_quick_jigsaw_runs_unchanged_and_logs_the_permutation_accuracy(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / NAME
    state = final_state(folder)
    assert state["heads.0.clf.0.weight"].shape == (32, 128)  # per patch
    assert state["heads.2.clf.0.weight"].shape == (100, 9 * 32)  # one logit per permutation
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    # an untrained 100-way classifier starts near log(100) = 4.6
    assert all(math.isfinite(r["loss"]) and 3.0 < r["loss"] < 7.0 for r in records)
    metrics = [json.loads(line) for line in (folder / "metrics.json").read_text().splitlines()]
    top1 = [m["train_accuracy_list_meter"]["top_1"]["0"] for m in metrics]
    assert len(top1) == 2 and all(0 <= v <= 100 for v in top1)


RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 4 steps per phase, 8 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


@pytest.mark.slow
def test_crash_and_resume_is_bitwise_exact(tmp_path: Path) -> None:
    crash_and_resume_states(tmp_path, QUICK, RESUME, crash_after=7, checkpoint_at=6, last=8)

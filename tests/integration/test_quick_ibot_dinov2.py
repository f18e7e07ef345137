"""iBOT and DINOv2 end to end: the quick configs run unchanged through the CLI and their
checkpoints hold the teacher and the centers; a crash (and, with ``-m slow``, a real
SIGKILL through the CLI) plus auto-resume ends bitwise equal to an uninterrupted run
(student, teacher, centers; the resumed steps draw the same crops and masks from (seed,
epoch, index)); on 2 processes every rank holds the same teacher and centers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.integration._runs import crash_and_resume_states, read_jsonl, run_config
from tests.integration.test_quick_dino_barlow import final_state, run_cli, sigkill_and_resume_cli
from tests.integration.test_quick_vicreg import assert_bitwise_equal

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

QUICK = "test/integration_test/"
#: config -> (its center buffers, the parts of the loss it logs)
METHODS = {
    "quick_ibot": (("center", "center2"), ("cls", "patch")),
    "quick_dinov2": (("center", "patch_center"), ("dino_loss", "koleo_loss", "ibot_loss")),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_quick_config_runs_unchanged_and_checkpoints_teacher_and_centers(tmp_path, name) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}{name}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / name
    state = final_state(folder)
    centers, parts = METHODS[name]
    for center in centers:
        assert torch.isfinite(state[f"loss.{center}"]).all()
        assert state[f"loss.{center}"].abs().sum() > 0  # moved from zero
    student = {k: v for k, v in state.items() if not k.startswith("loss.")}
    teacher = {
        k.removeprefix("loss.teacher."): v
        for k, v in state.items()
        if k.startswith("loss.teacher.")
    }
    assert teacher.keys() == student.keys()
    assert "trunk.patch_masking.masked_embed" in teacher
    assert any(not torch.equal(teacher[k], student[k]) for k in student)  # it lags
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    for record in records:
        values = [record["loss"], *(record[f"loss.{p}"] for p in parts)]
        assert all(math.isfinite(v) for v in values), record


RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 4 steps per phase, 8 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


@pytest.mark.parametrize("name", list(METHODS))
def test_crash_and_resume_is_bitwise_exact(tmp_path, name) -> None:
    full, resumed = crash_and_resume_states(
        tmp_path, QUICK + name, RESUME, crash_after=7, checkpoint_at=6, last=8
    )
    for center in METHODS[name][0]:
        assert torch.equal(full[f"loss.{center}"], resumed[f"loss.{center}"])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(METHODS))
def test_sigkill_and_resume_through_the_cli_is_bitwise_exact(tmp_path: Path, name) -> None:
    """A real kill -9 after iteration 7, then the same command again."""
    full, killed = sigkill_and_resume_cli(tmp_path, [f"config={QUICK}{name}", *RESUME], iteration=7)
    assert_bitwise_equal(final_state(full), final_state(killed))


@pytest.mark.slow
def test_two_processes_hold_the_same_teacher_and_centers(tmp_path) -> None:
    """DDP on 2 gloo ranks: the nested outputs and the mask token go through DDP, and the
    checkpoint written by rank 0 has finite centers and a teacher that lags the student."""
    run_config(
        QUICK + "quick_dinov2",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    state = final_state(tmp_path)
    assert torch.isfinite(state["loss.center"]).all() and state["loss.center"].abs().sum() > 0
    assert not torch.equal(state["loss.teacher.trunk.pos_embed"], state["trunk.pos_embed"])

"""VICReg end to end: the quick config runs unchanged through the CLI and logs the three
terms beside the loss (which they make up with the coefficients); the loss is stateless,
so the checkpoint holds the model only; a crash (and, with ``-m slow``, a real SIGKILL
through the CLI) plus auto-resume ends bitwise equal to an uninterrupted run; on 2
processes the logged loss and terms are those of the global batch (the same on every
rank)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.integration._runs import read_jsonl, run_config
from tests.integration.test_exact_resume import crash_generator
from tests.integration.test_quick_dino_barlow import final_state, run_cli, sigkill_and_resume_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

NAME = "quick_vicreg"
QUICK = "test/integration_test/" + NAME
TERMS = ("loss.invariance", "loss.variance", "loss.covariance")


def assert_logged_terms(records: list[dict]) -> None:
    """Every record logs the three raw terms; 25 * inv + 25 * var + 1 * cov is the loss."""
    for r in records:
        assert all(math.isfinite(r[k]) for k in TERMS), r
        assert r["loss.invariance"] >= 0 and 0 <= r["loss.variance"] <= 1
        assert r["loss.covariance"] >= 0
        total = 25 * r["loss.invariance"] + 25 * r["loss.variance"] + r["loss.covariance"]
        assert r["loss"] == pytest.approx(total, rel=1e-5)


# ----------------------------------------------------------------------------- CLI
def test_quick_vicreg_runs_unchanged_and_logs_its_terms(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / NAME  # the config's own CHECKPOINT.DIR, in the cwd
    assert (folder / "model_final_checkpoint_phase1.torch").exists()
    state = final_state(folder)
    assert not any(k.startswith("loss.") for k in state)  # a stateless loss
    assert any(k.startswith("heads.2.") for k in state)  # the expander's third layer
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in records)
    assert_logged_terms(records)
    assert "loss.covariance" in (folder / "log.txt").read_text()


# ----------------------------------------------------------------------------- resume
RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 4 steps per phase, 8 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


def assert_bitwise_equal(full: dict[str, torch.Tensor], resumed: dict[str, torch.Tensor]) -> None:
    assert full.keys() == resumed.keys()
    different = [k for k in full if not torch.equal(full[k], resumed[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


@pytest.mark.slow
def test_crash_and_resume_is_bitwise_exact(tmp_path: Path) -> None:
    """As tests/integration/test_exact_resume.py: a crash right after iteration 7 (the
    iteration checkpoint at 6 is inside phase 1), then auto-resume; the logged losses and
    terms of the resumed iterations are those of the uninterrupted run."""
    full = tmp_path / "full"
    run_config(QUICK, *RESUME, f"config.CHECKPOINT.DIR={full}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            QUICK, *RESUME, f"config.CHECKPOINT.DIR={crashed}", hook_generator=crash_generator(7)
        )
    assert not list(crashed.glob("model_final*"))
    run_config(QUICK, *RESUME, f"config.CHECKPOINT.DIR={crashed}")
    log = (crashed / "log.txt").read_text()
    assert "resuming from" in log and "resumed inside phase" in log
    assert_bitwise_equal(final_state(full), final_state(crashed))
    expected = {r["iteration"]: r for r in read_jsonl(str(full / "stdout.json"))}
    resumed = [r for r in read_jsonl(str(crashed / "stdout.json")) if r["iteration"] > 6]
    assert [r["iteration"] for r in resumed][-2:] == [7, 8]
    for r in resumed:
        for key in ("loss", *TERMS):
            assert r[key] == expected[r["iteration"]][key], (r["iteration"], key)


@pytest.mark.slow
def test_sigkill_and_resume_through_the_cli_is_bitwise_exact(tmp_path: Path) -> None:
    """A real kill -9 (no exception handling, no on_exception hooks) after iteration 7."""
    full, killed = sigkill_and_resume_cli(tmp_path, [f"config={QUICK}", *RESUME], iteration=7)
    assert_bitwise_equal(final_state(full), final_state(killed))


# ----------------------------------------------------------------------------- 2 processes
def test_two_processes_log_the_global_batchs_terms(tmp_path: Path) -> None:
    """2 ranks of 4 samples: the loss gathers the 8-row global batch on each rank; the
    logged loss and terms (all-reduced means of identical values) still add up."""
    run_config(
        QUICK,
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    records = read_jsonl(str(tmp_path / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert_logged_terms(records)
    assert (tmp_path / "model_final_checkpoint_phase1.torch").exists()

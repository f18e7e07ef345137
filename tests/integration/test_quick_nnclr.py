"""NNCLR end to end: the quick config runs unchanged through the CLI with its support set
filled then used; a crash (on 1 process, on 2 processes sharing one support set, and
with ``-m slow`` a real SIGKILL) plus auto-resume ends bitwise equal to an uninterrupted
run, model and support set (queue and count) included."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration._runs import read_jsonl, run_config
from tests.integration.test_exact_resume import crash_generator
from tests.integration.test_quick_dino_barlow import final_state, run_cli, sigkill_and_resume_cli
from vissl.utils.checkpoint import load_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

QUICK = "test/integration_test/quick_nnclr"


def support_set(folder: Path) -> dict[str, Any]:
    """The support set in the final checkpoint (the loss's state: one queue for all
    ranks, none per rank)."""
    (path,) = folder.glob("model_final_checkpoint_phase*.torch")
    classy = load_checkpoint(str(path))["classy_state_dict"]
    assert all("loss" not in r for r in classy["per_rank"])
    return classy["loss"]  # type: ignore[no-any-return]


def assert_bitwise_equal(full: Path, resumed: Path) -> None:
    """Model weights, and the queue and count of written projections."""
    a, b = final_state(full), final_state(resumed)
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"
    qa, qb = support_set(full), support_set(resumed)
    assert torch.equal(qa["written"], qb["written"])
    assert torch.equal(qa["queue"], qb["queue"])


def test_quick_config_runs_unchanged(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / "quick_nnclr"
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    # InfoNCE over 8 candidates: positive, at most about ln 8 + 2 / T at the start
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in records)
    state = support_set(folder)
    assert int(state["written"]) == 4 * 8  # 4 steps of 8 view-1 projections
    norms = state["queue"].norm(dim=1)
    torch.testing.assert_close(norms, torch.ones(16))  # full, normalised


RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 4 steps per phase, 8 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


def test_crash_and_resume_is_bitwise_exact_including_the_queue(tmp_path: Path) -> None:
    """A crash right after iteration 7; the iteration checkpoint at 6 holds a full
    support set (16 projections after 4 steps of 4), in use when the run resumes."""
    run_config(QUICK, *RESUME, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            QUICK, *RESUME, f"config.CHECKPOINT.DIR={crashed}", hook_generator=crash_generator(7)
        )
    assert not list(crashed.glob("model_final*"))
    saved = load_checkpoint(str(crashed / "model_iteration6.torch"))
    assert int(saved["classy_state_dict"]["loss"]["written"]) == 6 * 4
    run_config(QUICK, *RESUME, f"config.CHECKPOINT.DIR={crashed}")
    assert "resumed inside phase" in (crashed / "log.txt").read_text()
    assert int(support_set(tmp_path / "full")["written"]) == 8 * 4
    assert_bitwise_equal(tmp_path / "full", crashed)


TWO = [
    "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
    "config.DATA.TRAIN.DATA_LIMIT=32",  # 16 images per rank: 4 steps of 4 per phase
    *RESUME,
]


@pytest.mark.slow
def test_two_processes_crash_and_resume_with_one_support_set(tmp_path: Path) -> None:
    """Both ranks fill one support set (each step writes 2 x 4 view-1 projections); after
    a crash at iteration 7 and auto-resume, it is bitwise as in the uninterrupted run."""
    run_config(QUICK, *TWO, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            QUICK, *TWO, f"config.CHECKPOINT.DIR={crashed}", hook_generator=crash_generator(7)
        )
    run_config(QUICK, *TWO, f"config.CHECKPOINT.DIR={crashed}")
    assert "resumed inside phase" in (crashed / "log.txt").read_text()
    state = support_set(tmp_path / "full")
    assert int(state["written"]) == 8 * 2 * 4  # 8 steps of both ranks' 4 projections
    assert_bitwise_equal(tmp_path / "full", crashed)


@pytest.mark.slow
def test_sigkill_and_resume_through_the_cli_is_bitwise_exact(tmp_path: Path) -> None:
    """A real kill -9 after iteration 7, then the same command again."""
    full, killed = sigkill_and_resume_cli(tmp_path, [f"config={QUICK}", *RESUME], iteration=7)
    assert_bitwise_equal(full, killed)

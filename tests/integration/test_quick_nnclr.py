"""NNCLR end to end: the quick config runs unchanged through the CLI with its support set
filled then used; a crash (on 1 process, on 2 processes with a queue per rank, and with
``-m slow`` a real SIGKILL) plus auto-resume ends bitwise equal to an uninterrupted run,
model and every rank's support set (queue and count) included."""

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


def rank_states(folder: Path) -> list[dict[str, Any]]:
    """Every rank's support set in the final checkpoint (``per_rank[r]["loss"]``)."""
    (path,) = folder.glob("model_final_checkpoint_phase*.torch")
    classy = load_checkpoint(str(path))["classy_state_dict"]
    assert classy["loss"] == {}  # the queues are per-rank state only
    return [r["loss"] for r in classy["per_rank"]]


def assert_bitwise_equal(full: Path, resumed: Path) -> None:
    """Model weights, and each rank's queue and count of written projections."""
    a, b = final_state(full), final_state(resumed)
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"
    queues_a, queues_b = rank_states(full), rank_states(resumed)
    assert len(queues_a) == len(queues_b)
    for qa, qb in zip(queues_a, queues_b, strict=True):
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
    (state,) = rank_states(folder)
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
    assert int(saved["classy_state_dict"]["per_rank"][0]["loss"]["written"]) == 6 * 4
    run_config(QUICK, *RESUME, f"config.CHECKPOINT.DIR={crashed}")
    assert "resumed inside phase" in (crashed / "log.txt").read_text()
    assert int(rank_states(tmp_path / "full")[0]["written"]) == 8 * 4
    assert_bitwise_equal(tmp_path / "full", crashed)


TWO = [
    "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
    "config.DATA.TRAIN.DATA_LIMIT=32",  # 16 images per rank: 4 steps of 4 per phase
    *RESUME,
]


@pytest.mark.slow
def test_two_processes_crash_and_resume_with_a_queue_per_rank(tmp_path: Path) -> None:
    """Each rank keeps its own support set; after a crash at iteration 7 and auto-resume,
    each rank's queue is its own again, bitwise as in the uninterrupted run."""
    run_config(QUICK, *TWO, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            QUICK, *TWO, f"config.CHECKPOINT.DIR={crashed}", hook_generator=crash_generator(7)
        )
    run_config(QUICK, *TWO, f"config.CHECKPOINT.DIR={crashed}")
    assert "resumed inside phase" in (crashed / "log.txt").read_text()
    states = rank_states(tmp_path / "full")
    assert len(states) == 2
    assert not torch.equal(states[0]["queue"], states[1]["queue"])  # one queue per rank
    assert_bitwise_equal(tmp_path / "full", crashed)


@pytest.mark.slow
def test_sigkill_and_resume_through_the_cli_is_bitwise_exact(tmp_path: Path) -> None:
    """A real kill -9 after iteration 7, then the same command again."""
    full, killed = sigkill_and_resume_cli(tmp_path, [f"config={QUICK}", *RESUME], iteration=7)
    assert_bitwise_equal(full, killed)

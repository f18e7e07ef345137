"""DeepCluster-v2 end to end: the quick config runs unchanged through the CLI (a first
pass fills the memory, k-means before each epoch sets the swav_head's frozen prototypes);
a crash (on 1 process, on 2 processes with a memory per process, and with ``-m slow`` a
real SIGKILL) inside the second epoch, after its k-means, plus auto-resume ends bitwise
equal to an uninterrupted run: model, centroids, assignment table and every process's
memory."""

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

QUICK = "test/integration_test/quick_deepcluster_v2"


def rank_memories(folder: Path) -> list[dict[str, Any]]:
    """Every process's memory in the final checkpoint (``per_rank[r]["loss"]``)."""
    (path,) = folder.glob("model_final_checkpoint_phase*.torch")
    classy = load_checkpoint(str(path))["classy_state_dict"]
    assert "local_memory_embeddings" not in classy["loss"]  # per-process state only
    return [r["loss"] for r in classy["per_rank"]]


def assert_bitwise_equal(full: Path, resumed: Path) -> None:
    """Model weights, centroids, assignment table and each process's memory."""
    a, b = final_state(full), final_state(resumed)
    assert a.keys() == b.keys() and "loss.assignments" in a
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"
    mem_a, mem_b = rank_memories(full), rank_memories(resumed)
    assert len(mem_a) == len(mem_b)
    for ma, mb in zip(mem_a, mem_b, strict=True):
        assert torch.equal(ma["local_memory_index"], mb["local_memory_index"])
        assert torch.equal(ma["local_memory_embeddings"], mb["local_memory_embeddings"])


def test_quick_config_runs_unchanged(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / "quick_deepcluster_v2"
    log = (folder / "log.txt").read_text()
    assert "memory filled by a first pass (32 of 32 rows)" in log
    assert log.count("k-means (epoch") == 2
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == list(range(1, 9))
    # cross entropy over 8 clusters: positive and finite
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in records)
    state = final_state(folder)
    table = state["loss.assignments"]
    assert table.shape == (3, 32) and table.min() >= 0 and table.max() < 8  # all assigned
    for h in range(3):
        centroids = state[f"loss.centroids{h}"]
        torch.testing.assert_close(centroids.norm(dim=1), torch.ones(8))
        # the swav_head's prototypes are the centroids (frozen, set by k-means)
        assert torch.equal(state[f"heads.0.prototypes{h}.weight"], centroids)
    (memory,) = rank_memories(folder)
    assert sorted(memory["local_memory_index"].tolist()) == list(range(32))
    torch.testing.assert_close(memory["local_memory_embeddings"].norm(dim=2), torch.ones(2, 32))


RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 8 steps per epoch, 16 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]
# iteration checkpoint at 9 (1 step into epoch 1, after its k-means), crash after 11
CRASH_AT = 11


TWO = [
    "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
    "config.DATA.TRAIN.DATA_LIMIT=64",  # 32 images per process: 8 steps of 4 per epoch
    *RESUME,
]


@pytest.mark.slow
def test_two_processes_crash_and_resume_with_a_memory_per_process(tmp_path: Path) -> None:
    """Each process keeps the memory of its own samples; a crash inside epoch 1 (after
    its k-means) and auto-resume from the iteration checkpoint at 9 restores each
    process's memory, the centroids and the table, and ends bitwise equal. (One process:
    the SIGKILL test below, ``-m slow``.)"""
    run_config(QUICK, *TWO, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            QUICK,
            *TWO,
            f"config.CHECKPOINT.DIR={crashed}",
            hook_generator=crash_generator(CRASH_AT),
        )
    assert not list(crashed.glob("model_final*"))
    saved = load_checkpoint(str(crashed / "model_iteration9.torch"))
    assert saved["iteration_num"] == 1 and saved["phase_idx"] == 1
    run_config(QUICK, *TWO, f"config.CHECKPOINT.DIR={crashed}")
    log = (crashed / "log.txt").read_text()
    assert "resumed inside phase" in log
    assert "memory restored from the checkpoint" in log
    memories = rank_memories(tmp_path / "full")
    assert len(memories) == 2
    indices = [set(m["local_memory_index"].tolist()) for m in memories]
    assert not indices[0] & indices[1] and indices[0] | indices[1] == set(range(64))
    assert (final_state(tmp_path / "full")["loss.assignments"] >= 0).all()
    assert_bitwise_equal(tmp_path / "full", crashed)


@pytest.mark.slow
def test_sigkill_and_resume_through_the_cli_is_bitwise_exact(tmp_path: Path) -> None:
    """A real kill -9 after iteration 11, then the same command again."""
    full, killed = sigkill_and_resume_cli(
        tmp_path, [f"config={QUICK}", *RESUME], iteration=CRASH_AT
    )
    assert_bitwise_equal(full, killed)

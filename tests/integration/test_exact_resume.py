"""Exact resume: a run that crashes at iteration k and auto-resumes ends with bitwise the
same weights as an uninterrupted run — with phase and iteration checkpoints, 1 and 2
processes, 0 and 2 data loader workers. (tools/kill_and_resume.py does the same with real
SIGKILLs at random moments; see its closing table in the docs.)
"""

from __future__ import annotations

import pytest
import torch

from tests.integration._runs import run_config
from vissl.hooks import VisslHook, default_hook_generator
from vissl.utils.checkpoint import load_checkpoint

TINY = "test/cpu_test/tiny_simclr"


class CrashAt(VisslHook):
    """Raise right after the given global iteration (on every rank)."""

    priority = 1000  # after the checkpoint hook

    def __init__(self, iteration: int):
        self.iteration = iteration

    def on_step(self, task):
        if task.train and task.iteration == self.iteration:
            raise RuntimeError(f"simulated crash at {self.iteration}")


def crash_generator(iteration):
    def gen(cfg):
        return [*default_hook_generator(cfg), CrashAt(iteration)]

    return gen


def final_weights(folder):
    (path,) = folder.glob("model_final_checkpoint_phase*.torch")
    model = load_checkpoint(str(path))["classy_state_dict"]["base_model"]["model"]
    return {f"trunk.{k}": v for k, v in model["trunk"].items()} | {
        f"heads.{k}": v for k, v in model["heads"].items()
    }


def assert_same(a, b):
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


@pytest.mark.integration
@pytest.mark.parametrize(
    "nproc,workers,iter_freq,crash_at",
    [
        pytest.param(1, 0, 3, 5, marks=pytest.mark.slow),  # iteration checkpoint at 3, crash at 5
        pytest.param(
            1, 2, 3, 10, marks=pytest.mark.slow
        ),  # with workers; iteration checkpoint 9 is inside phase 1
        pytest.param(
            1, 0, -1, 11, marks=pytest.mark.slow
        ),  # phase checkpoints only: resume at the phase boundary
        pytest.param(
            2, 0, 2, 7, marks=pytest.mark.slow
        ),  # 2 processes (4 steps per phase), iteration checkpoint 6 in phase 1
        pytest.param(2, 2, 2, 3, marks=pytest.mark.slow),  # 2 processes with workers
    ],
)
def test_crash_and_resume_is_bitwise_exact(tmp_path, nproc, workers, iter_freq, crash_at):
    common = [
        "config.DATA.TRAIN.DATA_LIMIT=32",
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}",
        f"config.DATA.NUM_DATALOADER_WORKERS={workers}",
        f"config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY={iter_freq}",
        "config.CHECKPOINT.AUTO_RESUME=True",
        "config.MULTI_PROCESSING_METHOD=fork",
    ]
    run_config(TINY, *common, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            TINY,
            *common,
            f"config.CHECKPOINT.DIR={crashed}",
            hook_generator=crash_generator(crash_at),
        )
    assert not list(crashed.glob("model_final*"))
    run_config(TINY, *common, f"config.CHECKPOINT.DIR={crashed}")
    log = (crashed / "log.txt").read_text()
    if iter_freq > 0:
        assert "resumed inside phase" in log
    assert "resuming from" in log
    assert_same(final_weights(tmp_path / "full"), final_weights(crashed))

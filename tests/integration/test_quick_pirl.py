"""PIRL end to end: the quick config runs unchanged through the CLI (image crops and their
jigsaw patches as two named inputs, MULTI_INPUT_HEAD_MAPPING, the NCE loss of both heads
against the memory bank, updated by the image head); a crash plus auto-resume ends bitwise
equal to an uninterrupted run, memory bank included.

With ``VISSL_CONFIGS_DIR`` set to VISSL's ``configs/config`` folder, VISSL 0.1.6's own
``test/integration_test/quick_pirl.yaml`` runs unchanged on synthetic data on the CPU
(overrides for the data source, device and backend only; slow: ResNet-50 at 224 px).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest

from tests._vissl_configs import copy_vissl_config, needs_vissl_configs
from tests.integration._runs import crash_and_resume_states, read_jsonl, run_config
from tests.integration.test_quick_dino_barlow import final_state, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

NAME = "quick_pirl"
QUICK = "test/integration_test/" + NAME


def test_quick_pirl_runs_unchanged_with_two_inputs_and_two_heads(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / NAME
    state = final_state(folder)
    # the patch head: 128 -> 16 per patch, 9 concatenated, 144 -> 32; the image head 128 -> 32
    assert state["heads.0.0.clf.0.weight"].shape == (16, 128)
    assert state["heads.0.2.clf.0.weight"].shape == (32, 144)
    assert state["heads.1.0.clf.0.weight"].shape == (32, 128)
    assert state["loss.memory"].shape == (24, 32)
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in records)


RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=6",  # 4 steps per phase, 8 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


@pytest.mark.slow
def test_crash_and_resume_is_bitwise_exact(tmp_path: Path) -> None:
    crash_and_resume_states(tmp_path, QUICK, RESUME, crash_after=7, checkpoint_at=6, last=8)


# VISSL's file needs data, a GPU and nccl: these overrides swap in synthetic images and the
# CPU; nothing of the method (transforms, heads, mapping, loss, optimizer) is overridden.
VISSL_ENVIRONMENT = [
    "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
    "config.DATA.TRAIN.DATASET_NAMES=[]",
    "config.DATA.TRAIN.DATA_LIMIT=32",
    "config.DATA.NUM_DATALOADER_WORKERS=0",
    "config.MACHINE.DEVICE=cpu",
    "config.DISTRIBUTED.BACKEND=gloo",
    "config.OPTIMIZER.num_epochs=1",
]


@pytest.mark.slow
@needs_vissl_configs
def test_vissl_original_quick_pirl_runs_unchanged(tmp_path: Path, monkeypatch) -> None:
    name = copy_vissl_config(tmp_path, f"test/integration_test/{NAME}.yaml", monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # VISSL keys vissl accepts but does not implement
        task = run_config(name, *VISSL_ENVIRONMENT)
    assert task.iteration == 1  # 32 images, 32 per step
    assert math.isfinite(task.phase_average_loss())
    state = final_state(tmp_path)
    assert state["loss.memory"].shape == (32, 128)
    assert state["heads.0.2.clf.0.weight"].shape == (128, 1152)  # 9 x 128 concatenated

"""DeiT's supervised recipe end to end: the quick config (RandAugment, RandomErasing,
cutmixup_collator's soft targets, a ViT with vision_transformer_head, AdamW with
layer-wise lr decay) trains, and a crash plus auto-resume ends bitwise equal to an
uninterrupted run (the mixing is seeded per batch from (seed, epoch, indices), the
augmentations per sample)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.integration._runs import crash_and_resume_states, read_jsonl, run_config
from tests.integration.test_quick_dino_barlow import final_state
from vissl.utils.checkpoint import load_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

NAME = "quick_cutmixup_supervised"
QUICK = "test/integration_test/" + NAME


def test_quick_config_trains_with_soft_targets_and_layer_decay(tmp_path: Path) -> None:
    task = run_config(QUICK, f"config.CHECKPOINT.DIR={tmp_path}")
    assert task.iteration == 8
    records = read_jsonl(str(tmp_path / "stdout.json"))
    assert [r["iteration"] for r in records] == list(range(1, 9))
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in records)
    state = final_state(tmp_path)
    assert state["heads.0.layers.head.weight"].shape == (10, 32)
    (path,) = tmp_path.glob("model_final_checkpoint_phase*.torch")
    groups = load_checkpoint(str(path))["classy_state_dict"]["optimizer"]["param_groups"]
    # 2 blocks: the heads at 1, the last norm at 0.75, block i at 0.75 ** (2 - i), the
    # embeddings at 0.75 ** 3; the lr of each group is its scale times the schedule's
    scales = {g["param_group_name"]: g["lr_scale"] for g in groups}
    assert scales["layer3_regularized"] == 1.0
    assert scales["layer0_regularized"] == pytest.approx(0.75**3)
    assert scales["layer1_unregularized"] == pytest.approx(0.75**2)
    top = groups[0]["lr"]
    assert all(g["lr"] == pytest.approx(top * g["lr_scale"]) for g in groups)


RESUME = [
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


@pytest.mark.slow
def test_crash_and_resume_is_bitwise_exact(tmp_path: Path) -> None:
    crash_and_resume_states(tmp_path, QUICK, RESUME, crash_after=7, checkpoint_at=6, last=8)

"""The quick multi-crop SimCLR config runs unchanged end to end (synthetic data, CPU):
ImgPilToMultiCrop (2 x 24 px + 4 x 12 px) -> multicrop_collator -> per-resolution trunk
-> multicrop_simclr_info_nce_loss, with LARC SGD, for 2 epochs of 2 steps."""

from __future__ import annotations

import math

import pytest

from tests.integration._runs import read_jsonl, run_config
from vissl.losses.multicrop_simclr_info_nce_loss import MultiCropSimclrInfoNCELoss

NAME = "quick_simclr_multicrop"


@pytest.mark.integration
def test_quick_simclr_multicrop_trains(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # CHECKPOINT.DIR is relative to the current folder
    task = run_config(f"test/integration_test/{NAME}")
    assert task.iteration == 4  # DATA_LIMIT 8, batch 4, 2 epochs
    assert isinstance(task.loss, MultiCropSimclrInfoNCELoss)
    assert task.loss.num_crops == 6
    # The loss saw 6 crops of each of the 4 samples (24 rows): its masks were built for
    # 4 samples on 1 rank only.
    assert [key[:3] for key in task.loss.info_criterion._masks] == [(4, 1, 0)]
    ckpt_dir = tmp_path / "checkpoints" / NAME
    assert (ckpt_dir / "model_final_checkpoint_phase1.torch").exists()
    losses = [m["train_loss"] for m in read_jsonl(str(ckpt_dir / "metrics.json"))]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    # Random embeddings of 24 rows: each term is about log(1 + 20 negatives) ~ 3, far
    # from 0; a loss that ignored the negatives would be ~0.
    assert all(1.0 < v < 10.0 for v in losses)

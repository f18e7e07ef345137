"""VOC07 end to end: a fake VOCdevkit tree -> create_voc_data_files.py -> linear evaluation
with the shipped voc07 config (bce_logits_multiple_output_single_target, mean_ap_list_meter)
-> the reported mean AP equals scikit-learn's, computed here from the trained model."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import precision_recall_curve

from tests.extra_scripts._helpers import EXTRA_SCRIPTS
from tests.extra_scripts._voc import make_fake_voc
from tests.integration._runs import read_jsonl, run_config
from vissl.data import build_collate_fn, build_dataset
from vissl.utils.hydra_config import hydra_compose_and_validate

CONFIG = "benchmark/linear_image_classification/voc07/eval_resnet_8gpu_transfer_voc07_linear"
TRANSFORMS = "[{name:Resize,size:32},{name:ToTensor},{name:Normalize,mean:[0.5,0.5,0.5],std:[0.25,0.25,0.25]}]"


def _overrides(out: Path, run_dir: Path) -> list[str]:
    return [
        "config.MODEL.TRUNK.RESNETS.DEPTH=18",
        "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
        # res4: 64 channels pooled to 2 x 2; res5avg: 128
        "config.MODEL.HEAD.PARAMS=[[eval_mlp,{in_channels:64,dims:[256,20]}],"
        "[eval_mlp,{in_channels:128,dims:[128,20]}]]",
        f"config.DATA.TRAIN.DATA_PATHS=[{out / 'train_images.npy'}]",
        f"config.DATA.TRAIN.LABEL_PATHS=[{out / 'train_labels.npy'}]",
        f"config.DATA.TEST.DATA_PATHS=[{out / 'test_images.npy'}]",
        f"config.DATA.TEST.LABEL_PATHS=[{out / 'test_labels.npy'}]",
        f"config.DATA.TRAIN.TRANSFORMS={TRANSFORMS}",
        f"config.DATA.TEST.TRANSFORMS={TRANSFORMS}",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
        "config.DATA.TEST.BATCHSIZE_PER_REPLICA=8",
        "config.DATA.NUM_DATALOADER_WORKERS=0",
        "config.DATA.PIN_MEMORY=False",
        "config.OPTIMIZER.num_epochs=2",
        "config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.auto_scale=False",
        "config.OPTIMIZER.param_schedulers.lr.values=[0.05,0.01]",
        "config.OPTIMIZER.param_schedulers.lr.milestones=[1]",
        "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=False",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
        "config.DISTRIBUTED.BACKEND=gloo",
        "config.MACHINE.DEVICE=cpu",
        f"config.CHECKPOINT.DIR={run_dir}",
    ]


def _interpolated_ap(y: np.ndarray, s: np.ndarray) -> float:
    precision, recall, _ = precision_recall_curve(y, s)
    interpolated = np.maximum.accumulate(precision)  # from recall 1 down to 0
    return float(np.sum((recall[:-1] - recall[1:]) * interpolated[:-1]))


def _sklearn_map(scores: np.ndarray, targets: np.ndarray) -> float:
    aps = []
    for c in range(targets.shape[1]):
        counted = targets[:, c] != -1
        if (targets[counted, c] == 1).any():
            aps.append(_interpolated_ap(targets[counted, c], scores[counted, c]))
    return float(np.mean(aps))


@pytest.mark.integration
def test_fake_voc_tree_to_linear_eval_mean_ap(tmp_path: Path) -> None:
    root = tmp_path / "VOCdevkit" / "VOC2007"
    make_fake_voc(root, {"train": 12, "val": 12, "test": 16})
    out = tmp_path / "voc07"
    script = Path(EXTRA_SCRIPTS) / "datasets" / "create_voc_data_files.py"
    done = subprocess.run(
        [sys.executable, str(script), "--data_source_dir", str(root), "--output_dir", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    run_dir = tmp_path / "run"
    overrides = _overrides(out, run_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        task = run_config(CONFIG, *overrides)

    records = read_jsonl(str(run_dir / "metrics.json"))
    tests = [r["test_mean_ap_list_meter"] for r in records if "test_mean_ap_list_meter" in r]
    assert len(tests) == 2
    reported = tests[-1]
    assert sorted(reported["mAP"]) == ["res4", "res5avg"]
    assert all(len(reported["AP"][k]) == 20 for k in ("res4", "res5avg"))

    # the final model on the TEST split, scored here
    _, cfg = hydra_compose_and_validate([f"config={CONFIG}", *overrides])
    dataset = build_dataset(cfg, "TEST")
    collate = build_collate_fn(cfg, "TEST")
    batch = collate([dataset[i] for i in range(len(dataset))])
    targets = batch["label"][0].numpy()
    assert targets.shape == (16, 20) and (targets == -1).any()
    model = task.base_model.eval()
    with torch.no_grad():
        outputs = model(batch["data"][0])
    for name, logits in zip(["res4", "res5avg"], outputs, strict=True):
        expected = 100 * _sklearn_map(logits.numpy().astype(np.float64), targets)
        assert reported["mAP"][name] == pytest.approx(expected, abs=1e-3)

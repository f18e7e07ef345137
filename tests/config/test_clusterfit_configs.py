"""The ClusterFit configs: step 1 reads as CLUSTERFIT settings and extracts the layer it
clusters; the step-2 ImageNet configs hold the numbers their comments state and read step
1's files; the digits pair agrees on file names."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
import yaml

from tests.config.test_pretrain_method_configs import (
    IMAGENET_TRAIN_IMAGES,
    _build,
    _compose,
    _world_size,
)
from tests.config.test_shipped_configs import CONFIG_ROOT, CPU_OVERRIDES, NO_LABEL_FILES
from vissl.errors import ConfigError
from vissl.evaluation.clustering import ClusterFitSettings, output_prefix
from vissl.losses.cross_entropy_multiple_output_single_target import (
    CrossEntropyMultipleOutputSingleTargetLoss,
)
from vissl.optimizers.larc import LARC

STEP1 = "pretrain/clusterfit/cluster_features_resnet50_8gpu_imagenet"
# config -> (images per step, peak lr, iterations per epoch, warm-up epochs); VISSL's
# schedule: 0.1 per 256 images, x0.1 at epochs 30, 60, 90 and 100 of 105
STEP2 = {
    "pretrain/clusterfit/clusterfit_8gpu_resnet50": (256, 0.1, 5004, 0),
    "pretrain/clusterfit/clusterfit_64gpu_resnet50": (4096, 1.6, 312, 5),
}


def _step1_files(name: str, split: str, dim: int) -> str:
    cfg = _compose(name)
    s = ClusterFitSettings.from_config(cfg.CLUSTERFIT)
    return f"{s.output_dir}/{output_prefix(s, split, s.layer_name, dim)}"


def test_step1_imagenet_config_clusters_res5_of_train_and_val() -> None:
    cfg = _compose(STEP1)
    s = ClusterFitSettings.from_config(cfg.CLUSTERFIT)
    assert (s.num_clusters, s.layer_name, s.extract) == (16000, "res5", True)
    assert (s.data_partition, s.test_partition, s.backend) == ("TRAIN", "TEST", "faiss")
    pooled = [m[0] for m in cfg.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP]
    assert pooled == ["res5"]


@pytest.mark.parametrize("name", sorted(STEP2))
def test_step2_imagenet_config_builds_with_the_numbers_of_its_comments(name: str) -> None:
    images, peak, iterations, warmup_epochs = STEP2[name]
    with open(os.path.join(CONFIG_ROOT, f"{name}.yaml")) as f:
        data = yaml.safe_load(f)["config"]["DATA"]["TRAIN"]
    prefix = _step1_files(STEP1, "TRAIN", 2048)
    assert data["DATA_PATHS"] == [f"{prefix}_images.npy"]
    assert data["LABEL_PATHS"] == [f"{prefix}_labels.npy"]
    # step 1's files do not exist here: synthetic images, no label files
    cfg = _compose(name, *CPU_OVERRIDES[:2], *NO_LABEL_FILES)
    batch = int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
    assert batch * _world_size(cfg) == images
    assert math.ceil(IMAGENET_TRAIN_IMAGES / _world_size(cfg)) // batch == iterations
    assert cfg.MODEL.HEAD.PARAMS[0][1]["dims"] == [2048, 16000]
    _, loss, schedules, optimizer = _build(cfg)
    assert isinstance(loss, CrossEntropyMultipleOutputSingleTargetLoss)
    assert not isinstance(optimizer, LARC) and not cfg.OPTIMIZER.nesterov
    assert peak == pytest.approx(0.1 * images / 256)
    epochs = int(cfg.OPTIMIZER.num_epochs)
    assert epochs == 105
    start = peak / 4 if warmup_epochs else peak
    assert schedules.values(0.0)["lr"] == pytest.approx(start)
    for epoch, value in [
        (warmup_epochs, peak),
        (29.5, peak),
        (30.5, peak / 10),
        (60.5, peak / 100),
        (104.5, peak / 1e4),
    ]:
        assert schedules.values(epoch / epochs)["lr"] == pytest.approx(value, rel=1e-4)


def test_digits_step2_reads_the_files_of_digits_step1(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=r"LABEL_PATHS\[0\]=.*_labels.npy' does not exist"):
        _compose("digits/clusterfit")  # before step 1: a clear error
    with open(os.path.join(CONFIG_ROOT, "digits/clusterfit.yaml")) as f:
        data = yaml.safe_load(f)["config"]["DATA"]
    cfg = _compose(
        "digits/clusterfit",
        *NO_LABEL_FILES,
        "config.DATA.TEST.LABEL_SOURCES=[]",
        "config.DATA.TEST.LABEL_PATHS=[]",
    )
    step1 = _compose("digits/clusterfit_features")
    k = int(step1.CLUSTERFIT.NUM_CLUSTERS)
    assert cfg.MODEL.HEAD.PARAMS[0][1]["dims"] == [256, k]
    for split in ("TRAIN", "TEST"):
        prefix = _step1_files("digits/clusterfit_features", split, 256)
        assert data[split]["LABEL_PATHS"] == [f"{prefix}_labels.npy"]
        assert data[split]["LABEL_SOURCES"] == ["disk_filelist"]

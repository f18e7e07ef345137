"""Every shipped config composes and validates; the real-scale ones run a step on CPU."""

from __future__ import annotations

import glob
import os
import warnings

import pytest

from tests.integration._runs import REPO, run_config
from vissl.utils.hydra_config import hydra_compose_and_validate

CONFIG_ROOT = os.path.join(REPO, "configs", "config")
ALL = sorted(
    os.path.relpath(p, CONFIG_ROOT)[: -len(".yaml")]
    for p in glob.glob(os.path.join(CONFIG_ROOT, "**", "*.yaml"), recursive=True)
    if os.sep + "optimization" + os.sep not in p
)
CPU_OVERRIDES = [
    "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
    "config.DATA.TRAIN.DATA_PATHS=[]",
    "config.MACHINE.DEVICE=cpu",
    "config.DISTRIBUTED.BACKEND=gloo",
    "config.DISTRIBUTED.NUM_NODES=1",
    "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
    "config.DISTRIBUTED.RUN_ID=auto",
]

# Configs that train on the label files an earlier step writes (ClusterFit's step 2):
# composed without them here.
NO_LABEL_FILES = ["config.DATA.TRAIN.LABEL_SOURCES=[]", "config.DATA.TRAIN.LABEL_PATHS=[]"]
LATER_STEPS = ("digits/clusterfit", "pretrain/clusterfit/clusterfit_")


# Benchmark configs with real data paths (GPU users): synthetic data in both splits.
REAL_DATA_BENCHMARKS = (
    "benchmark/nearest_neighbor/imagenet1k/",
    "benchmark/nearest_neighbor/cifar10/",
    "benchmark/low_shot_transfer/imagenet1k/",
    "benchmark/linear_image_classification/imagenet1k/",
    "benchmark/linear_image_classification/cifar10/",
    "benchmark/svm/voc07/",
    "benchmark/linear_image_classification/voc07/",
)
BENCHMARK_OVERRIDES = [
    *CPU_OVERRIDES,
    "config.DATA.TEST.DATA_SOURCES=[synthetic]",
    "config.DATA.TEST.DATA_PATHS=[]",
]


@pytest.mark.parametrize("name", ALL)
def test_config_composes_and_validates(name):
    overrides = CPU_OVERRIDES if name.startswith("pretrain/") else []
    if name.startswith(REAL_DATA_BENCHMARKS):
        overrides = BENCHMARK_OVERRIDES
    if name.startswith(LATER_STEPS) and name != "digits/clusterfit_features":
        overrides = [*overrides, *NO_LABEL_FILES]
        if name.startswith("digits/"):
            overrides += ["config.DATA.TEST.LABEL_SOURCES=[]", "config.DATA.TEST.LABEL_PATHS=[]"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, cfg = hydra_compose_and_validate([f"config={name}", *overrides])
    assert cfg.OPTIMIZER.num_epochs >= 1


def test_group_file_composes_onto_pretrain_config():
    _, cfg = hydra_compose_and_validate(
        [
            "config=pretrain/simclr/simclr_64gpu_resnet",
            "+config/pretrain/simclr/optimization=bs32_16nodes",
            *CPU_OVERRIDES[:2],
        ]
    )
    assert cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA == 32
    assert cfg.LOSS.simclr_info_nce_loss.buffer_params.effective_batch_size == 32 * 2 * 128


@pytest.mark.integration
@pytest.mark.parametrize(
    "name",
    [
        "pretrain/simclr/simclr_8gpu_resnet",
        pytest.param("pretrain/simclr/simclr_64gpu_resnet", marks=pytest.mark.slow),
    ],
)
def test_real_scale_config_trains_one_step_on_cpu(tmp_path, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fp16 requested by nothing; bf16 autocast on CPU
        task = run_config(
            name,
            *CPU_OVERRIDES,
            "config.DATA.TRAIN.DATA_LIMIT=2",
            "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2",
            "config.DATA.NUM_DATALOADER_WORKERS=0",
            "config.DATA.TRAIN.DEFAULT_GRAY_IMG_SIZE=64",
            "config.DATA.TRAIN.TRANSFORMS.1.size=64",
            "config.OPTIMIZER.num_epochs=1",
            "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=False",
            f"config.CHECKPOINT.DIR={tmp_path}",
        )
    assert task.iteration == 1
    assert task.precision.name == "bf16"


def test_no_shipped_config_overwrites_a_finished_run() -> None:
    """#41 item 1: quick_start and 29 other configs set OVERWRITE_EXISTING: True, so a
    second config into their folder replaced a finished model. Overwriting is the user's
    explicit choice (config.CHECKPOINT.OVERWRITE_EXISTING=true on the command line)."""
    import yaml

    setting = []
    for name in ALL:
        with open(os.path.join(CONFIG_ROOT, name + ".yaml"), encoding="utf-8") as f:
            tree = yaml.safe_load(f) or {}
        checkpoint = ((tree.get("config") or {}).get("CHECKPOINT")) or {}
        if checkpoint.get("OVERWRITE_EXISTING"):
            setting.append(name)
    assert setting == [], f"shipped configs that set CHECKPOINT.OVERWRITE_EXISTING: {setting}"

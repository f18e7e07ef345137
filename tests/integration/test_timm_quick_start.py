"""quick_start with a timm trunk: 1 epoch of SimCLR on 8x8 digits with timm's ResNet-18, then
tools/nearest_neighbor_test.py on its checkpoint with the same trunk.

timm's ResNet-18 takes 8x8 images as they are (its stride-2 stem and max-pool leave 2x2,
layer2..4 end at 1x1), and its pooled feature has 512 values, the width the first head
takes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration._runs import run_config
from tests.tools._fixtures import drop_vissl_log_handlers  # noqa: F401 (autouse)
from vissl.evaluation.benchmarks import nearest_neighbor
from vissl.evaluation.cli import run_tool

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMM_TRUNK = [
    "config.MODEL.TRUNK.NAME=timm",
    "config.MODEL.TRUNK.TIMM.MODEL_NAME=resnet18",
    "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[512,512],use_relu:true,"
    "skip_last_layer_relu_bn:false}],[mlp,{dims:[512,64]}]]",
]
TRAIN = [
    *TIMM_TRUNK,
    "config.OPTIMIZER.num_epochs=1",
    "config.DATA.TRAIN.DATA_LIMIT=256",
    "config.DATA.NUM_DATALOADER_WORKERS=0",
    "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=false",
    "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=false",
]
LINE = re.compile(r"^nearest_neighbor: top-1 (\d+\.\d\d)% .* layer=trunk train=200 test=100$")


def test_quick_start_trains_a_timm_trunk_and_knn_reads_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train_dir = tmp_path / "train"
    run_config("quick_start", *TRAIN, f"config.CHECKPOINT.DIR={train_dir}")
    ckpt = train_dir / "model_final_checkpoint_phase0.torch"
    assert ckpt.is_file()

    capsys.readouterr()
    rc = run_tool(
        "nearest_neighbor_test",
        nearest_neighbor.main,
        [
            "config=benchmark/nearest_neighbor/digits/nn_digits_quick_start",
            *TIMM_TRUNK,
            f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={ckpt}",
            "config.DATA.TRAIN.DATA_LIMIT=200",
            "config.DATA.TEST.DATA_LIMIT=100",
            f"config.CHECKPOINT.DIR={tmp_path / 'knn'}",
        ],
    )
    out, err = capsys.readouterr()
    assert rc == 0, err[-3000:]
    found = [m for line in out.splitlines() if (m := LINE.match(line.strip()))]
    assert found, out[-2000:]
    assert float(found[-1].group(1)) > 20.0  # 10 classes: well above chance
    assert "PARAMS_FILE is empty" not in err

"""Every method's quick config trains end to end on CUDA, in fp32, bf16 and fp16, with
compile and channels_last, and a crash on CUDA resumes bitwise."""

from __future__ import annotations

import math

import pytest

from tests.gpu._cuda import CUDA, PRECISION_BF16, PRECISION_FP16, crash_and_resume_bitwise
from tests.integration._runs import read_jsonl, run_config

QUICK = [
    "test/integration_test/quick_moco",
    "test/integration_test/quick_simclr_multicrop",
    "test/integration_test/quick_swav",
    "test/integration_test/quick_swav_momentum",
    "test/integration_test/quick_swav_queue",
    "test/integration_test/quick_dino",
    "test/integration_test/quick_dino_vit",
    "test/integration_test/quick_barlow_twins",
    "test/integration_test/quick_byol",
    "test/integration_test/quick_simsiam",
    "test/integration_test/quick_moco_v3",
    "test/integration_test/quick_moco_v3_vit",
    "test/integration_test/quick_vicreg",
    "test/integration_test/quick_nnclr",
    "test/integration_test/quick_rotnet",
    "test/integration_test/quick_jigsaw",
    "test/integration_test/quick_colorization",
    "test/integration_test/quick_npid",
    "test/integration_test/quick_pirl",
    "test/integration_test/quick_deepcluster_v2",
    "test/integration_test/quick_mae",
    "test/integration_test/quick_ibot",
    "test/integration_test/quick_dinov2",
    "test/integration_test/quick_msn",
    "test/integration_test/quick_ijepa",
    "test/cpu_test/tiny_simclr",
    "test/cpu_test/tiny_supervised",
]
PRECISIONS = {"fp32": [], "bf16": PRECISION_BF16, "fp16": PRECISION_FP16}


def _losses(folder) -> list[float]:
    return [float(r["loss"]) for r in read_jsonl(str(folder / "stdout.json")) if "loss" in r]


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("config", QUICK)
def test_quick_config_trains_on_cuda(tmp_path, config, precision) -> None:
    run_config(config, *CUDA, *PRECISIONS[precision], f"config.CHECKPOINT.DIR={tmp_path}")
    assert list(tmp_path.glob("model_final_checkpoint_phase*.torch"))
    losses = _losses(tmp_path)
    assert losses and all(math.isfinite(v) for v in losses), losses


@pytest.mark.parametrize(
    "config", ["test/integration_test/quick_moco", "test/integration_test/quick_dino_vit"]
)
def test_compile_and_channels_last_on_cuda(tmp_path, config) -> None:
    run_config(
        config,
        *CUDA,
        *PRECISIONS["bf16"],
        "config.MODEL.COMPILE.USE_COMPILE=True",
        "config.MODEL.CHANNELS_LAST=True",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    assert all(math.isfinite(v) for v in _losses(tmp_path))


@pytest.mark.parametrize(
    "config,crash_at",
    [("test/integration_test/quick_moco", 5), ("test/integration_test/quick_dino", 3)],
)
def test_crash_and_resume_on_cuda_is_bitwise(tmp_path, config, crash_at) -> None:
    crash_and_resume_bitwise(config, tmp_path, crash_at)


FSDP = "config.TRAINER.TASK_NAME=self_supervision_fsdp_task"


@pytest.mark.parametrize(
    "config,limit", [("test/integration_test/quick_dino", 16), ("quick_start", 512)]
)
def test_fsdp_task_trains_on_cuda_in_bf16_and_writes_a_sharded_checkpoint(tmp_path, config, limit):
    run_config(
        config,
        *CUDA,
        *PRECISIONS["bf16"],
        FSDP,
        "config.MODEL.FSDP_CONFIG.compute_dtype=bfloat16",
        "config.OPTIMIZER.num_epochs=1",
        f"config.DATA.TRAIN.DATA_LIMIT={limit}",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    assert list(tmp_path.glob("model_final_checkpoint_phase*"))
    losses = _losses(tmp_path)
    assert losses and all(math.isfinite(v) for v in losses), losses


def test_fsdp_task_crash_and_resume_on_cuda_is_bitwise(tmp_path) -> None:
    crash_and_resume_bitwise("test/integration_test/quick_dino", tmp_path, 3, FSDP)

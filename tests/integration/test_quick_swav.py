"""The four quick SwAV configs train unchanged on a CPU (synthetic data, a few steps)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.integration._runs import run_config

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

QUICK = "test/integration_test/"


def _run(name: str, tmp_path) -> object:
    return run_config(QUICK + name, f"config.CHECKPOINT.DIR={tmp_path}")


def _prototypes(task) -> torch.Tensor:
    return task.base_model.heads[0].prototypes0.weight.detach()


@pytest.mark.parametrize(
    "name,steps,crops",
    [("quick_swav", 2, 2), ("quick_swav_multicrop", 2, 4), ("quick_swav_queue", 3, 2)],
)
def test_quick_swav_configs_train(tmp_path, name, steps, crops) -> None:
    task = _run(name, tmp_path)
    assert task.iteration == steps
    loss = task.loss
    assert loss.num_crops == crops  # inferred from ImgPilToMultiCrop
    assert loss.num_prototypes == [32] and loss.embedding_dim == 16  # from the swav_head
    assert math.isfinite(task.phase_average_loss())
    protos = _prototypes(task)
    assert torch.allclose(protos.norm(dim=1), torch.ones(32), atol=1e-5)
    if name == "quick_swav_queue":
        assert loss.queue.length == 16 and loss.queue.filled == 16
        assert loss.queue.is_ready(task.iteration - 1)  # it joined the last step's codes


def test_quick_swav_momentum_trains(tmp_path) -> None:
    task = _run("quick_swav_momentum", tmp_path)
    assert task.iteration == 2
    encoder = task.loss.momentum_encoder
    assert not encoder.training  # eval mode from iteration 1 (momentum_eval_mode_iter_start)
    model_w = dict(task.base_model.named_parameters())
    moved = [n for n, p in encoder.named_parameters() if not torch.equal(p, model_w[n].detach())]
    assert moved  # the EMA copy lags the model
    m_protos = encoder.heads[0].prototypes0.weight
    assert torch.allclose(m_protos.norm(dim=1), torch.ones(32), atol=1e-5)
    assert math.isfinite(task.phase_average_loss())


@pytest.mark.parametrize(
    "name", ["pretrain/swav/swav_8gpu_resnet", "pretrain/swav/swav_64gpu_resnet"]
)
@pytest.mark.slow
def test_real_scale_config_trains_one_step_on_cpu(tmp_path, name) -> None:
    import warnings

    from tests.config.test_shipped_configs import CPU_OVERRIDES

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 autocast on CPU, LARC, SyncBN on CPU
        task = run_config(
            name,
            *CPU_OVERRIDES,
            "config.DATA.TRAIN.DATA_LIMIT=2",
            "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2",
            "config.DATA.NUM_DATALOADER_WORKERS=0",
            "config.DATA.TRAIN.DEFAULT_GRAY_IMG_SIZE=72",
            # Crops of at least 32 px: with 16 px crops layer4's strided 3x3 conv sees a 1x1
            # input, and PyTorch's CPU bf16 weight gradient for that shape (stride 2, padding
            # 1) reads uninitialised memory: NaN in the taps that only see padding, depending
            # on what the allocator last held (torch 2.14.1, reproduced outside vissl).
            "config.DATA.TRAIN.TRANSFORMS.0.size_crops=[64,32]",
            "config.OPTIMIZER.num_epochs=1",
            "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=False",
            f"config.CHECKPOINT.DIR={tmp_path}",
        )
    assert task.iteration == 1
    assert task.loss.num_crops == 8 and task.loss.num_prototypes == [3000]
    assert task.precision.name == "bf16"

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
    # the encoder normalises with the model's BatchNorm statistics (VISSL copies them)
    model_b = dict(task.base_model.named_buffers())
    stats = [n for n in model_b if "running_" in n]
    assert stats and all(torch.equal(b, model_b[n]) for n, b in encoder.named_buffers())


# quick_swav_momentum with 4 crops of two resolutions (2 assign crops) and the encoder in
# eval mode from iteration 0 (the default), 16 images in batches of 4 per process
MOMENTUM_4_CROPS = [
    "config.DATA.TRAIN.TRANSFORMS.0.total_num_crops=4",
    "config.DATA.TRAIN.TRANSFORMS.0.num_crops=[2,2]",
    "config.DATA.TRAIN.TRANSFORMS.0.size_crops=[12,8]",
    "config.DATA.TRAIN.TRANSFORMS.0.crop_scales=[[0.3,1.0],[0.1,0.3]]",
    "config.LOSS.swav_momentum_loss.momentum_eval_mode_iter_start=0",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
    "config.OPTIMIZER.num_epochs=2",
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


def _assert_encoder_has_the_models_statistics(state: dict[str, torch.Tensor]) -> None:
    stats = [k for k in state if k.startswith("trunk.") and "running_" in k]
    assert stats
    for k in stats:
        assert torch.equal(state[f"loss.momentum_encoder.{k}"], state[k]), k


@pytest.mark.slow
def test_swav_momentum_crash_and_resume_is_bitwise(tmp_path) -> None:
    """One process, 8 steps (2 phases of 4): iteration checkpoint at 6, a crash after 7."""
    from tests.integration._runs import crash_and_resume_states

    _, resumed = crash_and_resume_states(
        tmp_path,
        QUICK + "quick_swav_momentum",
        MOMENTUM_4_CROPS,
        crash_after=7,
        checkpoint_at=6,
        last=8,
    )
    _assert_encoder_has_the_models_statistics(resumed)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # four 2-process runs
def test_swav_momentum_under_fsdp_equals_ddp_and_resumes_bitwise(tmp_path) -> None:
    """2 processes, 4 steps (2 phases of 2): the sharded run (encoder sharded like the
    model) equals DDP's, the encoder's BN statistics equal the model's, and a crash after
    iteration 3 (iteration checkpoint at 3, inside phase 1) resumes bitwise."""
    from tests.integration.test_exact_resume import crash_generator
    from tests.integration.test_fsdp import FSDP, TWO, assert_close, final_state
    from tests.integration.test_quick_vicreg import assert_bitwise_equal

    config = QUICK + "quick_swav_momentum"
    args = [*MOMENTUM_4_CROPS, TWO]
    run_config(config, *args, f"config.CHECKPOINT.DIR={tmp_path / 'ddp'}")
    run_config(config, *args, FSDP, f"config.CHECKPOINT.DIR={tmp_path / 'fsdp'}")
    ddp, fsdp = final_state(tmp_path / "ddp"), final_state(tmp_path / "fsdp")
    assert "FSDP: 10 units over 2 ranks" in (tmp_path / "fsdp" / "log.txt").read_text()
    assert any(k.startswith("loss.momentum_encoder.trunk.") for k in fsdp)
    assert_close(ddp, fsdp, atol=1e-5)
    _assert_encoder_has_the_models_statistics(fsdp)

    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            config,
            *args,
            FSDP,
            f"config.CHECKPOINT.DIR={crashed}",
            hook_generator=crash_generator(3),
        )
    run_config(config, *args, FSDP, f"config.CHECKPOINT.DIR={crashed}")
    assert "resumed inside phase 1" in (crashed / "log.txt").read_text()
    assert_bitwise_equal(fsdp, final_state(crashed))


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

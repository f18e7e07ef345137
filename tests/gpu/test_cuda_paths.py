"""The CUDA side of #22's fixes: RNG state of the current device, workers forked after
the launcher's GPU checks, the EMA kept on the CPU of a GPU model, portable
checkpoints, and (with 2+ GPUs) DDP, manual reduction and SyncBN over sub-groups."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.gpu._cuda import CUDA, SyncCounter, crash_and_resume_bitwise
from tests.integration._runs import REPO, run_config
from vissl.hooks import default_hook_generator
from vissl.utils.checkpoint import get_rng_state, load_checkpoint, set_rng_state

MOCO = "test/integration_test/quick_moco"


def test_cuda_rng_state_of_the_current_device_round_trips() -> None:
    torch.cuda.manual_seed(3)
    torch.rand(1, device="cuda")  # initialise the generator
    state = get_rng_state()
    assert isinstance(state["cuda"], torch.Tensor)
    a = torch.rand(5, device="cuda")
    set_rng_state(state)
    assert torch.equal(a, torch.rand(5, device="cuda"))
    # an older checkpoint holding every device's state, more than are visible here
    old = dict(state, cuda=[state["cuda"]] * (torch.cuda.device_count() + 3))
    set_rng_state(old)
    assert torch.equal(a, torch.rand(5, device="cuda"))


def test_workers_forked_after_the_launch_checks_can_use_cuda(tmp_path) -> None:
    """The launcher's GPU checks used torch.cuda.is_available() (cuInit) in the parent:
    a worker forked afterwards failed to initialise CUDA."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {REPO!r})
        import torch
        from vissl.utils.distributed_launcher import launch_distributed
        from vissl.utils.hydra_config import hydra_compose_and_validate
        _, cfg = hydra_compose_and_validate([
            "config={MOCO}", "config.MACHINE.DEVICE=gpu", "config.DISTRIBUTED.BACKEND=nccl",
            "config.MULTI_PROCESSING_METHOD=fork", "config.CHECKPOINT.DIR={tmp_path}",
        ])
        launch_distributed(cfg, always_spawn=True)
        assert not torch.cuda.is_initialized(), "the launcher initialised CUDA"
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(tmp_path.glob("model_final_checkpoint_phase*.torch"))


def _ema_run(folder, device: str, counter=None):
    gen = None
    if counter is not None:
        gen = lambda cfg: [*default_hook_generator(cfg), counter]  # noqa: E731
    run_config(
        MOCO,
        *CUDA,
        "config.HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True",
        "config.HOOKS.EMA_MODEL.DECAY=0.9",
        f"config.HOOKS.EMA_MODEL.EMA_DEVICE={device}",
        "config.REPRODUCIBILITY.CUDDN_DETERMINISTIC=True",
        "config.LOG_FREQUENCY=1000",
        f"config.CHECKPOINT.DIR={folder}",
        hook_generator=gen,
    )
    (path,) = folder.glob("model_final_checkpoint_phase*.torch")
    return load_checkpoint(str(path))["classy_state_dict"]["ema_model"]["model"]["trunk"]


def test_ema_on_the_cpu_of_a_gpu_model_has_no_host_sync_and_equals_the_gpu_ema(tmp_path) -> None:
    counter = SyncCounter()
    on_cpu = _ema_run(tmp_path / "cpu", "cpu", counter)
    on_gpu = _ema_run(tmp_path / "gpu", "gpu")
    quiet = [n for _, log, n, _ in counter.per_step if not log]
    assert quiet and not any(quiet), counter.per_step
    for k in on_gpu:
        torch.testing.assert_close(on_cpu[k], on_gpu[k], rtol=1e-5, atol=1e-6, msg=k)


def test_checkpoints_written_on_cuda_hold_cpu_tensors(tmp_path) -> None:
    run_config(MOCO, *CUDA, f"config.CHECKPOINT.DIR={tmp_path}")
    (path,) = tmp_path.glob("model_final_checkpoint_phase*.torch")
    state = torch.load(path, weights_only=True)  # no map_location: as saved

    def devices(obj):
        if isinstance(obj, torch.Tensor):
            yield obj.device.type
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from devices(v)
        elif isinstance(obj, list | tuple):
            for v in obj:
                yield from devices(v)

    found = set(devices(state))
    assert found == {"cpu"}, found


# ---------------------------------------------------------------------- 2+ GPUs
@pytest.mark.multi_gpu
@pytest.mark.parametrize("manual", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_two_gpus_train_with_ddp_and_manual_reduction(tmp_path, manual, precision) -> None:
    amp = (
        ["config.MODEL.AMP_PARAMS.USE_AMP=True", "config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16"]
        if precision == "bf16"
        else []
    )
    run_config(
        MOCO,
        *CUDA,
        *amp,
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.MULTI_PROCESSING_METHOD=forkserver",
        f"config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION={manual}",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    assert list(tmp_path.glob("model_final_checkpoint_phase*.torch"))


@pytest.mark.multi_gpu
def test_two_gpus_moco_with_sync_bn_sub_groups(tmp_path) -> None:
    run_config(
        MOCO,
        *CUDA,
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.MULTI_PROCESSING_METHOD=fork",
        "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=True",
        "config.MODEL.SYNC_BN_CONFIG.GROUP_SIZE=1",
        "config.HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    assert list(tmp_path.glob("model_final_checkpoint_phase*.torch"))


@pytest.mark.multi_gpu
def test_two_gpus_crash_and_resume_bitwise(tmp_path) -> None:
    crash_and_resume_bitwise(
        MOCO,
        tmp_path,
        5,
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.MULTI_PROCESSING_METHOD=forkserver",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2",
    )


def test_env_for_the_suite_is_sane() -> None:
    assert torch.cuda.is_available() and os.environ.get("CUDA_LAUNCH_BLOCKING") != "1"

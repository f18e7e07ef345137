"""Launch-time checks of GPUs: they must not initialise CUDA in a process that forks
its workers afterwards (#22 item 2), and a fork after CUDA was initialised is refused."""

from __future__ import annotations

import pytest
import torch

from vissl.errors import ConfigError
from vissl.launch import launcher
from vissl.utils.hydra_config import hydra_compose_and_validate


def _cfg(tmp_path, *overrides: str):
    _, cfg = hydra_compose_and_validate(
        [
            "config=test/integration_test/quick_moco",
            "config.MACHINE.DEVICE=gpu",
            "config.DISTRIBUTED.BACKEND=nccl",
            "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
            "config.MULTI_PROCESSING_METHOD=fork",
            f"config.CHECKPOINT.DIR={tmp_path}",
            *overrides,
        ]
    )
    return cfg


@pytest.fixture
def two_gpus_by_nvml(monkeypatch):
    """A machine with 2 GPUs that NVML counts; any CUDA initialisation is recorded."""
    calls: list[str] = []

    def poisons_fork(*args, **kwargs):
        calls.append("cudaGetDeviceCount")
        return 2

    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", poisons_fork, raising=False)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 2, raising=False)
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "_cached_device_count", None, raising=False)
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    return calls


def _launch_without_workers(monkeypatch, cfg) -> list[str]:
    started: list[str] = []
    monkeypatch.setattr(launcher, "run_worker_group", lambda job, method: started.append(method))
    launcher.launch_distributed(cfg)
    return started


def test_gpu_checks_before_fork_do_not_initialise_cuda(tmp_path, monkeypatch, two_gpus_by_nvml):
    started = _launch_without_workers(monkeypatch, _cfg(tmp_path))
    assert started == ["fork"]
    assert two_gpus_by_nvml == [], "the launcher initialised CUDA before forking its workers"


def test_gpu_count_is_still_checked_before_fork(tmp_path, monkeypatch, two_gpus_by_nvml):
    with pytest.raises(ConfigError, match=r"NUM_PROC_PER_NODE=3 but only 2 GPUs") as err:
        _launch_without_workers(
            monkeypatch, _cfg(tmp_path, "config.DISTRIBUTED.NUM_PROC_PER_NODE=3")
        )
    assert err.value.key_path == "config.DISTRIBUTED.NUM_PROC_PER_NODE"
    assert two_gpus_by_nvml == []


def test_fork_after_cuda_was_initialised_is_a_config_error(tmp_path, monkeypatch, two_gpus_by_nvml):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match="forkserver") as err:
        _launch_without_workers(monkeypatch, _cfg(tmp_path))
    assert err.value.key_path == "config.MULTI_PROCESSING_METHOD"
    # spawn and forkserver start clean processes: no error
    started = _launch_without_workers(
        monkeypatch, _cfg(tmp_path, "config.MULTI_PROCESSING_METHOD=forkserver")
    )
    assert started == ["forkserver"]

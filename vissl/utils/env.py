"""Device selection."""

from __future__ import annotations

from typing import Any

import torch

from vissl.errors import ConfigError


def get_device(cfg: Any, local_rank: int = 0) -> torch.device:
    """The device for this process from MACHINE.DEVICE (cuda:<local_rank> for gpu).

    Raises:
        ConfigError: MACHINE.DEVICE=gpu without CUDA, or fewer GPUs than processes.
    """
    if cfg.MACHINE.DEVICE == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(
            "config.MACHINE.DEVICE=gpu but CUDA is not available on this machine. Set "
            "config.MACHINE.DEVICE=cpu (and config.DISTRIBUTED.BACKEND=gloo) to train on CPU.",
            "config.MACHINE.DEVICE",
        )
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"process {local_rank} needs GPU {local_rank} but only "
            f"{torch.cuda.device_count()} are visible: lower "
            "config.DISTRIBUTED.NUM_PROC_PER_NODE.",
            "config.DISTRIBUTED.NUM_PROC_PER_NODE",
        )
    torch.cuda.set_device(local_rank)
    apply_cuda_backend_settings(cfg)
    return torch.device("cuda", local_rank)


def apply_cuda_backend_settings(cfg: Any) -> None:
    """``MACHINE.ALLOW_TF32``, ``MACHINE.CUDNN_BENCHMARK`` and
    ``REPRODUCIBILITY.CUDDN_DETERMINISTIC`` applied to torch's CUDA backends.

    Deterministic cudnn wins over ``CUDNN_BENCHMARK`` (benchmarking picks algorithms by
    timing, which differs from run to run).
    """
    machine = cfg.get("MACHINE", {}) if hasattr(cfg, "get") else {}
    deterministic = bool(cfg.get("REPRODUCIBILITY", {}).get("CUDDN_DETERMINISTIC", False))
    tf32 = bool(machine.get("ALLOW_TF32", True))
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = (
        bool(machine.get("CUDNN_BENCHMARK", True)) and not deterministic
    )

"""Launch-time checks: backend and devices against the machine, torchrun's environment,
a checkpoint folder that can be written."""

from __future__ import annotations

import os
from typing import Any

import torch
from iopath.common.file_io import g_pathmgr

from vissl.errors import ConfigError

#: Environment variables that mean "started by torchrun".
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")

_KEY = "config.DISTRIBUTED"


def get_node_id(node_id: int, num_nodes: int) -> int:
    """``node_id``, or SLURM's node index for a multi-node ``srun`` (as VISSL)."""
    if (
        node_id == 0
        and num_nodes > 1
        and "SLURM_STEP_NODELIST" in os.environ
        and "SLURM_NODEID" in os.environ
    ):
        return int(os.environ["SLURM_NODEID"])
    return node_id


def fork_safe_gpu_count() -> int | None:
    """GPUs visible to this process, counted without initialising CUDA in it.

    ``torch.cuda.is_available()`` initialises the CUDA driver (``cuInit``), after which
    worker processes *forked* from this one cannot use CUDA. NVML counts the devices
    (honouring ``CUDA_VISIBLE_DEVICES``) without that. Returns None when NVML cannot
    tell (no NVML library, MIG device names): counting would then poison fork.
    """
    if not torch.backends.cuda.is_built():
        return 0
    if torch.cuda.is_initialized():
        return torch.cuda.device_count()  # already initialised: nothing left to protect
    nvml_count = getattr(torch.cuda, "_device_count_nvml", None)
    if nvml_count is None:
        return None
    try:
        count = int(nvml_count())
    except Exception:
        return None
    return count if count >= 0 else None


def gpu_count(will_fork: bool) -> int | None:
    """GPUs visible here; None when that cannot be known without poisoning a fork.

    Args:
        will_fork: worker processes are forked from this process afterwards
            (``MULTI_PROCESSING_METHOD: fork``): CUDA must stay uninitialised here.
    """
    count = fork_safe_gpu_count()
    if count is not None or will_fork:
        return count
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_fork_after_cuda(cfg: Any, will_fork: bool) -> None:
    """A forked worker cannot use CUDA once this process has initialised it.

    Raises:
        ConfigError: ``MULTI_PROCESSING_METHOD: fork`` with ``MACHINE.DEVICE: gpu`` and
            CUDA already initialised in the launching process (e.g. by the user's code
            before ``launch_distributed``).
    """
    if will_fork and cfg.MACHINE.DEVICE == "gpu" and torch.cuda.is_initialized():
        raise ConfigError(
            "config.MULTI_PROCESSING_METHOD=fork with config.MACHINE.DEVICE=gpu, but CUDA is "
            "already initialised in the launching process, so forked workers cannot use it. "
            "Set config.MULTI_PROCESSING_METHOD=forkserver (or spawn), or do not touch CUDA "
            "before launching.",
            "config.MULTI_PROCESSING_METHOD",
        )


def check_backend(cfg: Any, world_size: int, will_fork: bool = False) -> str:
    backend = str(cfg.DISTRIBUTED.BACKEND)
    if world_size <= 1 or backend != "nccl":
        return backend
    if cfg.MACHINE.DEVICE == "cpu":
        reason = "config.MACHINE.DEVICE=cpu"
    elif gpu_count(will_fork) == 0:
        reason = "CUDA is not available on this machine"
    else:
        return backend
    raise ConfigError(
        f"{_KEY}.BACKEND=nccl needs CUDA GPUs, but {reason}. Set {_KEY}.BACKEND=gloo "
        "(and config.MACHINE.DEVICE=cpu) to run several processes on CPU.",
        f"{_KEY}.BACKEND",
    )


def check_devices(cfg: Any, nproc: int, will_fork: bool = False) -> None:
    """GPUs against ``MACHINE.DEVICE`` and ``NUM_PROC_PER_NODE``, without poisoning a fork.

    When the GPUs cannot be counted without initialising CUDA here (``will_fork`` and no
    NVML), the workers check instead (:func:`vissl.utils.env.get_device`).
    """
    if cfg.MACHINE.DEVICE != "gpu":
        return
    check_fork_after_cuda(cfg, will_fork)
    visible = gpu_count(will_fork)
    if visible is None:
        return
    if visible == 0:
        raise ConfigError(
            "config.MACHINE.DEVICE=gpu but CUDA is not available on this machine. Set "
            f"config.MACHINE.DEVICE=cpu (and {_KEY}.BACKEND=gloo) to train on CPU.",
            "config.MACHINE.DEVICE",
        )
    if nproc > visible:
        raise ConfigError(
            f"{_KEY}.NUM_PROC_PER_NODE={nproc} but only {visible} GPUs are visible on this "
            f"node: set {_KEY}.NUM_PROC_PER_NODE={visible} (one process per GPU).",
            f"{_KEY}.NUM_PROC_PER_NODE",
        )


def torchrun_environment() -> dict[str, int] | None:
    """torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and
    ``GROUP_RANK``, or None when this process was not started by torchrun."""
    if not all(k in os.environ for k in TORCHRUN_ENV):
        return None
    env = {k: int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    for key in ("LOCAL_WORLD_SIZE", "GROUP_RANK"):
        if key in os.environ:
            env[key] = int(os.environ[key])
    return env


def check_torchrun(cfg: Any, env: dict[str, int]) -> tuple[int, int]:
    """(node id, processes per node) under torchrun; a mismatch is a ConfigError."""
    num_nodes = int(cfg.DISTRIBUTED.NUM_NODES)
    nproc = int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)
    local_world = env.get("LOCAL_WORLD_SIZE", nproc)
    if num_nodes * nproc != env["WORLD_SIZE"] or nproc != local_world:
        raise ConfigError(
            f"torchrun started WORLD_SIZE={env['WORLD_SIZE']} processes, {local_world} per "
            f"node, but the config asks for {_KEY}.NUM_NODES={num_nodes} x "
            f"NUM_PROC_PER_NODE={nproc}. Make them agree: set "
            f"{_KEY}.NUM_PROC_PER_NODE={local_world} and "
            f"{_KEY}.NUM_NODES={max(1, env['WORLD_SIZE'] // max(1, local_world))} "
            "(torchrun --nproc_per_node / --nnodes).",
            f"{_KEY}.NUM_PROC_PER_NODE",
        )
    node_id = env.get("GROUP_RANK", env["RANK"] // nproc)
    return node_id, nproc


def make_checkpoint_folder(folder: str) -> None:
    """Create ``folder`` (CHECKPOINT.DIR) if needed and check that it can be written,
    before any work starts.

    Raises:
        ConfigError: the folder cannot be created, or is not writable.
    """
    key = "config.CHECKPOINT.DIR"
    try:
        g_pathmgr.mkdirs(folder)
    except OSError as err:
        reason = err.strerror or str(err)
        raise ConfigError(
            f"{key}={folder!r} cannot be created ({reason}): set {key} to a folder you can "
            "write, e.g. config.CHECKPOINT.DIR=./checkpoints/my_run.",
            key,
        ) from None
    if "://" not in folder and not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{key}={folder!r} is not writable by this user: set {key} to a folder you can "
            "write, e.g. config.CHECKPOINT.DIR=./checkpoints/my_run.",
            key,
        )

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


def check_backend(cfg: Any, world_size: int) -> str:
    backend = str(cfg.DISTRIBUTED.BACKEND)
    if (
        world_size > 1
        and backend == "nccl"
        and (cfg.MACHINE.DEVICE == "cpu" or not torch.cuda.is_available())
    ):
        reason = (
            "config.MACHINE.DEVICE=cpu"
            if cfg.MACHINE.DEVICE == "cpu"
            else "CUDA is not available on this machine"
        )
        raise ConfigError(
            f"{_KEY}.BACKEND=nccl needs CUDA GPUs, but {reason}. Set {_KEY}.BACKEND=gloo "
            "(and config.MACHINE.DEVICE=cpu) to run several processes on CPU.",
            f"{_KEY}.BACKEND",
        )
    return backend


def check_devices(cfg: Any, nproc: int) -> None:
    if cfg.MACHINE.DEVICE != "gpu":
        return
    if not torch.cuda.is_available():
        raise ConfigError(
            "config.MACHINE.DEVICE=gpu but CUDA is not available on this machine. Set "
            f"config.MACHINE.DEVICE=cpu (and {_KEY}.BACKEND=gloo) to train on CPU.",
            "config.MACHINE.DEVICE",
        )
    visible = torch.cuda.device_count()
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

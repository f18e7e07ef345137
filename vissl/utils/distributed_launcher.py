"""``launch_distributed``: run an engine in one process, or spawn one process per device.

- World size is ``DISTRIBUTED.NUM_NODES * NUM_PROC_PER_NODE``; global rank is
  ``node_id * NUM_PROC_PER_NODE + local_rank``.
- One process runs in-process (no spawn, no process group). Several are started with
  ``torch.multiprocessing`` using ``MULTI_PROCESSING_METHOD`` and join a process group
  (``gloo`` on CPU, ``nccl`` on GPU) through ``INIT_METHOD`` / ``RUN_ID``.
- Every worker imports ``config.IMPORTS`` (and entry-point plugins) before it reads any
  registry, so user train steps, hooks and losses exist in every process.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from iopath.common.file_io import g_pathmgr

from vissl.errors import ConfigError
from vissl.utils.checkpoint import find_resume_checkpoint, has_final_checkpoint
from vissl.utils.hydra_config import config_to_yaml
from vissl.utils.imports import import_plugins
from vissl.utils.test_utils import find_free_port

logger = logging.getLogger(__name__)


def get_checkpoint_folder(cfg: Any, dist_run_id: str | None = None) -> str:
    """CHECKPOINT.DIR (plus the run id if APPEND_DISTR_RUN_ID), created if needed."""
    folder = os.path.abspath(str(cfg.CHECKPOINT.DIR))
    if cfg.CHECKPOINT.APPEND_DISTR_RUN_ID and dist_run_id:
        folder = os.path.join(folder, str(dist_run_id).replace(":", "-").replace("/", "_"))
    g_pathmgr.mkdirs(folder)
    return folder


def get_dist_run_id(cfg: Any, num_nodes: int) -> str:
    """The rendezvous address for INIT_METHOD/RUN_ID."""
    method = cfg.DISTRIBUTED.INIT_METHOD
    run_id = str(cfg.DISTRIBUTED.RUN_ID)
    if method == "tcp":
        if run_id == "auto":
            if num_nodes > 1:
                raise ConfigError(
                    "config.DISTRIBUTED.RUN_ID=auto only works on one node: with NUM_NODES > 1 "
                    "set RUN_ID=<host of node 0>:<free port>, the same on every node.",
                    "config.DISTRIBUTED.RUN_ID",
                )
            return f"localhost:{find_free_port()}"
        return run_id
    if method == "file":
        if run_id in ("auto", ""):
            return tempfile.mktemp(prefix="vissl_rendezvous_")
        return run_id
    return run_id  # env: MASTER_ADDR/MASTER_PORT from the environment


def _init_method(method: str, run_id: str) -> str:
    if method == "tcp":
        return f"tcp://{run_id}"
    if method == "file":
        return f"file://{run_id}"
    return "env://"


def _check_backend(cfg: Any, world_size: int) -> str:
    backend = cfg.DISTRIBUTED.BACKEND
    if (
        world_size > 1
        and backend == "nccl"
        and (cfg.MACHINE.DEVICE == "cpu" or not torch.cuda.is_available())
    ):
        raise ConfigError(
            "config.DISTRIBUTED.BACKEND=nccl needs CUDA GPUs, but "
            + (
                "config.MACHINE.DEVICE=cpu"
                if cfg.MACHINE.DEVICE == "cpu"
                else "CUDA is not available on this machine"
            )
            + ". Set config.DISTRIBUTED.BACKEND=gloo (and config.MACHINE.DEVICE=cpu) to run "
            "several processes on CPU.",
            "config.DISTRIBUTED.BACKEND",
        )
    return str(backend)


def _distributed_worker(
    local_rank: int,
    cfg: Any,
    node_id: int,
    world_size: int,
    dist_run_id: str,
    engine_name: str,
    checkpoint_path: str | None,
    checkpoint_folder: str,
    hook_generator: Callable[[Any], list[Any]] | None,
) -> Any:
    from vissl.engines import run_engine

    import_plugins(cfg.IMPORTS or [])
    nproc = int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)
    rank = node_id * nproc + local_rank
    if world_size > 1:
        if cfg.MACHINE.DEVICE == "cpu":
            # Each process gets its share of the cores instead of all of them.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
        dist.init_process_group(
            backend=cfg.DISTRIBUTED.BACKEND,
            init_method=_init_method(cfg.DISTRIBUTED.INIT_METHOD, dist_run_id),
            rank=rank,
            world_size=world_size,
        )
    try:
        return run_engine(
            engine_name,
            cfg,
            dist_run_id,
            checkpoint_path,
            checkpoint_folder,
            local_rank,
            node_id,
            hook_generator,
        )
    finally:
        if world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def launch_distributed(
    cfg: Any,
    node_id: int = 0,
    engine_name: str = "train",
    hook_generator: Callable[[Any], list[Any]] | None = None,
) -> Any:
    """Run ``engine_name`` for this node (VISSL's signature).

    Args:
        cfg: the validated ``config`` section.
        node_id: this node's index (0 for a single machine).
        engine_name: a registered engine (``train``, ...).
        hook_generator: ``cfg -> list of hooks``; defaults to ``default_hook_generator``.
            For several processes it must be picklable (a module-level function).

    Returns:
        The engine's result when it runs in-process (one process), else None.
    """
    num_nodes = int(cfg.DISTRIBUTED.NUM_NODES)
    nproc = int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)
    world_size = num_nodes * nproc
    _check_backend(cfg, world_size)
    dist_run_id = get_dist_run_id(cfg, num_nodes)
    folder = get_checkpoint_folder(cfg, dist_run_id)

    checkpoint_path = None
    if engine_name == "train":
        if has_final_checkpoint(folder) and not cfg.CHECKPOINT.OVERWRITE_EXISTING:
            logging.getLogger("vissl").warning(
                "training in %s has already finished (a final checkpoint exists); set "
                "config.CHECKPOINT.OVERWRITE_EXISTING=True to train again.",
                folder,
            )
            print(f"vissl: training in {folder} has already finished; nothing to do.")
            return None
        if cfg.CHECKPOINT.AUTO_RESUME and not has_final_checkpoint(folder):
            checkpoint_path = find_resume_checkpoint(
                folder, int(cfg.CHECKPOINT.LATEST_CHECKPOINT_RESUME_FILE_NUM)
            )
        if node_id == 0:
            with open(os.path.join(folder, "train_config.yaml"), "w", encoding="utf-8") as f:
                f.write(config_to_yaml(cfg))

    args = (
        cfg,
        node_id,
        world_size,
        dist_run_id,
        engine_name,
        checkpoint_path,
        folder,
        hook_generator,
    )
    if world_size == 1:
        return _distributed_worker(0, *args)
    mp.start_processes(
        _distributed_worker,
        args=args,
        nprocs=nproc,
        join=True,
        start_method=str(cfg.MULTI_PROCESSING_METHOD),
    )
    return None

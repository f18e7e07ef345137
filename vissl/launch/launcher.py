"""``launch_distributed``: run an engine on one process, N processes, several nodes or torchrun.

- World size is ``DISTRIBUTED.NUM_NODES * NUM_PROC_PER_NODE``; global rank is
  ``node_id * NUM_PROC_PER_NODE + local_rank``.
- One process runs in-process (no spawn, no process group). Several are started with
  ``torch.multiprocessing`` (``MULTI_PROCESSING_METHOD``) and join a process group
  (``BACKEND``: ``gloo`` on CPU, ``nccl`` on GPU; each GPU process binds its own device);
  see :mod:`~vissl.launch.rendezvous`, :mod:`~vissl.launch.worker`,
  :mod:`~vissl.launch.supervision`.
- Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` set), this
  process joins torchrun's group instead of spawning; the config's process counts must
  match torchrun's.
- The run folder: for training, the launcher of global rank 0 takes its lock
  (:mod:`~vissl.launch.run_lock`: a second live run into the folder is refused), then
  decides once what the run does with it (:mod:`~vissl.launch.run_folder`: nothing when
  it finished, resume, or start afresh with an older run moved aside) and hands the resume
  choice to its processes in their :class:`RunContext`; the processes of other nodes (and
  torchrun's other ranks) take rank 0's choice when they meet.
- Every worker imports ``config.IMPORTS`` (and entry-point plugins) before it reads any
  registry, so user train steps, hooks and losses exist in every process.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist

from vissl.engines import run_engine_in_context
from vissl.engines.run_context import HookGenerator, RunContext
from vissl.errors import ConfigError
from vissl.hooks import default_hook_generator
from vissl.launch.checks import (
    check_backend,
    check_devices,
    check_torchrun,
    get_node_id,
    make_checkpoint_folder,
    torchrun_environment,
)
from vissl.launch.rendezvous import make_rendezvous
from vissl.launch.run_folder import prepare_train_folder
from vissl.launch.run_lock import RunLock
from vissl.launch.supervision import run_worker_group
from vissl.launch.worker import ERROR_FILE_ENV, Job, apply_nccl_env, bind_device, record_error
from vissl.trainer.checkpointing import ResumeChoice
from vissl.utils.checkpoint import has_final_checkpoint
from vissl.utils.imports import import_plugins

logger = logging.getLogger(__name__)

_KEY = "config.DISTRIBUTED"


def get_checkpoint_folder(cfg: Any, dist_run_id: str | None = None) -> str:
    """CHECKPOINT.DIR (plus the run id if APPEND_DISTR_RUN_ID), created if needed."""
    folder = os.path.abspath(str(cfg.CHECKPOINT.DIR))
    if cfg.CHECKPOINT.APPEND_DISTR_RUN_ID and dist_run_id:
        folder = os.path.join(folder, str(dist_run_id).replace(":", "-").replace("/", "_"))
    make_checkpoint_folder(folder)
    return folder


def prepare_run(
    cfg: Any,
    engine_name: str,
    run_id: str,
    hook_generator: HookGenerator | None,
    node_id: int,
    primary: bool,
    folder: str | None = None,
) -> RunContext | None:
    """The run context of this node's local rank 0, or None when training already finished.

    Creates the run folder. For training, the ``primary`` launcher (of global rank 0; it
    holds the folder's lock, see :func:`run_folder_lock`) decides what the run does with
    the folder (:func:`~vissl.launch.run_folder.prepare_train_folder`); the others only
    look for a finished run and take rank 0's resume choice when the processes meet.
    ``train_config.yaml`` is written by the trainer, once the resume is known to fit.

    Raises:
        RunFolderError: the folder holds a finished run of another config.
        ResumeMismatchError: AUTO_RESUME found a checkpoint of another model.
    """
    folder = folder or get_checkpoint_folder(cfg, run_id)
    if engine_name != "train":
        choice = ResumeChoice()
    elif primary:
        choice = prepare_train_folder(cfg, folder)
    else:
        finished = has_final_checkpoint(folder) and not cfg.CHECKPOINT.OVERWRITE_EXISTING
        choice = ResumeChoice(finished=finished)
    if choice.finished:
        logging.getLogger("vissl").warning(
            "training in %s has already finished (a final checkpoint of this config "
            "exists); set config.CHECKPOINT.OVERWRITE_EXISTING=True to train again (the "
            "finished run is moved to %s/previous_runs/).",
            folder,
            folder,
        )
        print(f"vissl: training in {folder} has already finished; nothing to do.")
        return None
    return RunContext(
        cfg=cfg,
        engine_name=engine_name,
        run_id=run_id,
        checkpoint_folder=folder,
        hook_generator=hook_generator or default_hook_generator,
        checkpoint_path=choice.checkpoint_path,
        local_rank=0,
        node_id=node_id,
    )


@contextmanager
def run_folder_lock(cfg: Any, engine_name: str, run_id: str, primary: bool) -> Iterator[str]:
    """Create the run folder and, for the ``primary`` launcher of a training run, hold
    its lock (:class:`~vissl.launch.run_lock.RunLock`) until the block ends.

    Yields:
        The run folder.

    Raises:
        RunFolderLockedError: another live run holds the folder's lock.
    """
    folder = get_checkpoint_folder(cfg, run_id)
    lock = RunLock.acquire(folder, run_id) if primary and engine_name == "train" else None
    try:
        yield folder
    finally:
        if lock is not None:
            lock.release()


def _launch_under_torchrun(
    cfg: Any, env: dict[str, int], engine_name: str, hook_generator: HookGenerator | None
) -> Any:
    node_id, nproc = check_torchrun(cfg, env)
    rank, world_size, local_rank = env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]
    check_backend(cfg, world_size)
    check_devices(cfg, nproc)
    run_id = f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '')}"
    with run_folder_lock(cfg, engine_name, run_id, rank == 0) as folder:
        ctx = prepare_run(cfg, engine_name, run_id, hook_generator, node_id, rank == 0, folder)
        if ctx is None:
            return None
        return _run_under_torchrun(ctx, cfg, rank, world_size, local_rank, node_id)


def _run_under_torchrun(
    ctx: RunContext, cfg: Any, rank: int, world_size: int, local_rank: int, node_id: int
) -> Any:
    logger.info(
        "torchrun: rank %d of %d (node %d, local rank %d)", rank, world_size, node_id, local_rank
    )
    import_plugins(cfg.IMPORTS or [])
    apply_nccl_env(cfg)
    device = bind_device(cfg, local_rank)
    if world_size > 1:
        kwargs: dict[str, Any] = {}
        if device is not None and str(cfg.DISTRIBUTED.BACKEND) == "nccl":
            kwargs["device_id"] = device
        dist.init_process_group(
            backend=str(cfg.DISTRIBUTED.BACKEND),
            init_method="env://",
            rank=rank,
            world_size=world_size,
            **kwargs,
        )
    try:
        return run_engine_in_context(ctx.with_rank(local_rank))
    except Exception as err:
        if ERROR_FILE_ENV in os.environ:  # torchrun's summary then shows this traceback
            record_error(err)
        raise
    finally:
        if world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def launch_distributed(
    cfg: Any,
    node_id: int = 0,
    engine_name: str = "train",
    hook_generator: HookGenerator | None = None,
    *,
    always_spawn: bool = False,
) -> Any:
    """Run ``engine_name`` for this node (VISSL's signature).

    Args:
        cfg: the validated ``config`` section.
        node_id: this node's index (0 for a single machine); under a multi-node ``srun``
            SLURM's node index is used.
        engine_name: a registered engine (``train``, ...).
        hook_generator: ``cfg -> list of hooks``; defaults to ``default_hook_generator``.
            For several processes with ``spawn``/``forkserver`` it must be picklable (a
            module-level function).
        always_spawn: start a worker process even for one process (the SLURM launcher
            does, so that it can supervise preemption).

    Returns:
        The engine's result when it runs in this process (one process, torchrun), else
        None.

    Raises:
        ConfigError: an impossible distributed setting, named by its key.
        DistributedWorkerError: a worker failed (its traceback is in the message); a
            worker's own :class:`~vissl.errors.VisslError` is re-raised as is.
        TrainingPreempted: the workers checkpointed and stopped on SIGTERM/SIGUSR1.
    """
    env = torchrun_environment()
    if env is not None:
        return _launch_under_torchrun(cfg, env, engine_name, hook_generator)

    num_nodes = int(cfg.DISTRIBUTED.NUM_NODES)
    nproc = int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)
    world_size = num_nodes * nproc
    node_id = get_node_id(int(node_id), num_nodes)
    if not 0 <= node_id < num_nodes:
        raise ConfigError(
            f"node_id={node_id} is not in [0, {_KEY}.NUM_NODES={num_nodes}): give each node "
            f"an index from 0 to {num_nodes - 1} (node_id=... on the command line).",
            f"{_KEY}.NUM_NODES",
        )
    # Workers forked after this point cannot use CUDA if these checks initialised it.
    will_fork = (world_size > 1 or always_spawn) and str(cfg.MULTI_PROCESSING_METHOD) == "fork"
    check_backend(cfg, world_size, will_fork)
    check_devices(cfg, nproc, will_fork)

    if world_size == 1 and not always_spawn:
        with run_folder_lock(cfg, engine_name, "local", True) as folder:
            ctx = prepare_run(cfg, engine_name, "local", hook_generator, node_id, True, folder)
            if ctx is None:
                return None
            import_plugins(cfg.IMPORTS or [])
            return run_engine_in_context(ctx)

    rdzv = make_rendezvous(cfg, node_id, num_nodes)
    error_dir = tempfile.mkdtemp(prefix="vissl_worker_errors_")
    primary = node_id == 0
    try:
        with run_folder_lock(cfg, engine_name, rdzv.run_id, primary) as folder:
            ctx = prepare_run(
                cfg, engine_name, rdzv.run_id, hook_generator, node_id, primary, folder
            )
            if ctx is None:
                return None
            logger.info(
                "launching %d processes on node %d of %d (world size %d, %s rendezvous %s)",
                nproc,
                node_id,
                num_nodes,
                world_size,
                rdzv.method,
                rdzv.run_id,
            )
            # Import vissl's and the user's plugins once here: forked workers inherit them.
            import_plugins(cfg.IMPORTS or [])
            job = Job(ctx=ctx, world_size=world_size, nproc=nproc, rdzv=rdzv, error_dir=error_dir)
            run_worker_group(job, str(cfg.MULTI_PROCESSING_METHOD))
    finally:
        rdzv.close()
        shutil.rmtree(error_dir, ignore_errors=True)
    return None

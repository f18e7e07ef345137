"""One worker process: its environment, threads, device, process group, engine and errors.

A failing worker records its error in the standard format of
``torch.distributed.elastic`` (``ErrorHandler``: a JSON error file named by
``TORCHELASTIC_ERROR_FILE``). Under torchrun that variable is set by torchrun, whose
failure summary then shows the worker's traceback; under vissl's own launcher it points
into the run's error folder, where the supervisor reads it back with elastic's
``ProcessFailure`` (see :mod:`vissl.launch.supervision`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

from vissl.engines import run_engine_in_context
from vissl.engines.run_context import RunContext
from vissl.errors import TrainingInterrupted, TrainingPreempted, VisslError
from vissl.launch.rendezvous import Rendezvous, init_process_group
from vissl.trainer.stopping import aborted_by_user
from vissl.utils.imports import VISSL_PLUGIN_PACKAGES, import_plugins

logger = logging.getLogger(__name__)

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


#: Modules a forkserver imports once, so that workers fork from it instead of each
#: importing torch and vissl (seconds each): the launcher and every plugin package.
PRELOAD: tuple[str, ...] = ("vissl.launch", *VISSL_PLUGIN_PACKAGES)


@dataclass
class Job:
    """What every spawned worker of a node needs (picklable).

    Attributes:
        ctx: the run context of local rank 0 (each worker takes its own local rank).
        world_size: processes over all nodes.
        nproc: processes on this node.
        rdzv: how to join the process group.
        error_dir: where failing workers leave their error files.
    """

    ctx: RunContext
    world_size: int
    nproc: int
    rdzv: Rendezvous
    error_dir: str

    def rank_of(self, local_rank: int) -> int:
        return self.ctx.node_id * self.nproc + local_rank

    def error_file(self, rank: int) -> str:
        return os.path.join(self.error_dir, f"rank{rank}.json")


def set_worker_env(rank: int, local_rank: int, world_size: int, nproc: int, node: int) -> None:
    """torchrun's variables, so code that reads them works the same under both launchers."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK=str(node),
    )


def apply_nccl_env(cfg: Any) -> None:
    if cfg.DISTRIBUTED.NCCL_DEBUG:
        os.environ.setdefault("NCCL_DEBUG", "INFO")
    if str(cfg.DISTRIBUTED.NCCL_SOCKET_NTHREADS):
        os.environ.setdefault("NCCL_SOCKET_NTHREADS", str(cfg.DISTRIBUTED.NCCL_SOCKET_NTHREADS))


def bind_device(cfg: Any, local_rank: int) -> torch.device | None:
    """Bind this process to its GPU (``MACHINE.DEVICE=gpu``); None on CPU."""
    if cfg.MACHINE.DEVICE == "gpu" and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return None


def worker_threads(start_method: str, nproc: int) -> int:
    """Intra-op threads of one of ``nproc`` workers on a node.

    ``OMP_NUM_THREADS``, when the user set it, wins. ``fork``: one, as in PyTorch's
    DataLoader workers: OpenMP (libgomp) is not fork-safe, and a forked child of a process
    that already ran multi-threaded ops hangs in its first multi-threaded op. Otherwise
    the node's cores are shared out, on GPU as on CPU (8 GPU workers each using every
    core oversubscribe the CPU the data loaders need).
    """
    explicit = os.environ.get("OMP_NUM_THREADS", "")
    if explicit.isdigit() and int(explicit) > 0:
        return int(explicit)
    if start_method == "fork":
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return max(1, (cores or os.cpu_count() or 1) // max(1, nproc))


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (no orphaned workers)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _reset_worker_signals() -> None:
    # The launcher forwards preemption signals and Ctrl-C; until the trainer installs its
    # own handlers, they have their default effect here. A fork inherits the parent's
    # Python handlers (e.g. submitit's), which must not run in a worker.
    for name in ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGCONT"):
        signum = getattr(signal, name, None)
        if signum is not None:
            signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A process group of its own: a terminal's Ctrl-C (SIGINT to the foreground process
    # group) reaches the launcher alone, which forwards exactly one SIGINT per key press.
    # Otherwise each worker would get two (the terminal's and the forwarded one) and
    # take the first Ctrl-C for the second, which aborts.
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    if "SUBMITIT_EXECUTOR" in os.environ:
        # submitit's preemption signal is handled by the launcher, not by workers.
        name = "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
        signum = getattr(signal, name, None)
        if signum is not None:
            signal.signal(signum, signal.SIG_IGN)


def record_error(err: BaseException) -> None:
    """Write ``err`` to this process's elastic error file (``TORCHELASTIC_ERROR_FILE``).

    A :class:`~vissl.errors.VisslError` is also pickled beside it, so the launcher can
    re-raise the user's error as it was. Reporting never hides the error itself.
    """
    try:
        ErrorHandler().record_exception(err)
        path = os.environ.get(ERROR_FILE_ENV)
        if path and isinstance(err, VisslError):
            with open(path + ".pickle", "wb") as f:
                pickle.dump(err, f)
    except Exception:
        pass


def is_communication_error(message: str) -> bool:
    """Whether an error message (``"Type: text"``) is a peer's failure seen through a
    collective (torch's ``Dist*Error`` types, or a closed connection)."""
    if message.split(":", 1)[0].startswith("Dist"):
        return True
    return any(
        s in message
        for s in (
            "Connection closed by peer",
            "Connection reset by peer",
            "Broken pipe",
            "Socket Timeout",
        )
    )


def worker_main(local_rank: int, job: Job) -> None:
    """Entry point of a spawned worker: set up, join the group, run the engine.

    Exit codes: 0 done, :attr:`TrainingPreempted.exit_code` stopped for preemption after
    a checkpoint, :attr:`TrainingInterrupted.exit_code` (130) stopped by Ctrl-C (after a
    checkpoint, or at once on a second Ctrl-C), 1 failed (the traceback goes to stderr
    and to the error file).
    """
    _die_with_parent()
    _reset_worker_signals()
    ctx = job.ctx.with_rank(local_rank)
    cfg = ctx.cfg
    rank = job.rank_of(local_rank)
    os.environ[ERROR_FILE_ENV] = job.error_file(rank)
    code = 0
    try:
        set_worker_env(rank, local_rank, job.world_size, job.nproc, ctx.node_id)
        apply_nccl_env(cfg)
        import_plugins(cfg.IMPORTS or [])
        torch.set_num_threads(worker_threads(str(cfg.MULTI_PROCESSING_METHOD), job.nproc))
        device = bind_device(cfg, local_rank)
        init_process_group(cfg, job.rdzv, rank, job.world_size, device)
        run_engine_in_context(ctx)
    except TrainingPreempted:
        code = TrainingPreempted.exit_code
    except TrainingInterrupted:
        code = TrainingInterrupted.exit_code
    except SystemExit:
        raise
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt) or aborted_by_user():
            # Ctrl-C before training started, or a second one (then a peer's abort may
            # surface here as a communication error): not a failure to report
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(TrainingInterrupted.exit_code)
        record_error(err)
        print(
            f"vissl: rank {rank} (node {ctx.node_id}, local rank {local_rank}) failed:\n"
            + traceback.format_exc(),
            file=sys.stderr,
            flush=True,
        )
        # No orderly shutdown of the process group: the other ranks may be stuck in a
        # collective with this one. Exiting closes the connections, which fails them fast.
        sys.exit(1)
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(code)

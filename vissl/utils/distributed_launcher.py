"""``launch_distributed``: run an engine on one process, N processes, several nodes or torchrun.

- World size is ``DISTRIBUTED.NUM_NODES * NUM_PROC_PER_NODE``; global rank is
  ``node_id * NUM_PROC_PER_NODE + local_rank``.
- One process runs in-process (no spawn, no process group). Several are started with
  ``torch.multiprocessing`` (``MULTI_PROCESSING_METHOD``) and join a process group
  (``BACKEND``: ``gloo`` on CPU, ``nccl`` on GPU; each GPU process binds its own device).
- Rendezvous (``INIT_METHOD`` / ``RUN_ID``):

  - ``tcp``: ``RUN_ID: auto`` (one node) picks a free port, retried if it is taken before
    use; ``RUN_ID: host:port`` (several nodes: the host of node 0, the same on every node).
    Node 0's launcher holds the rendezvous store itself, so a busy explicit port is a clear
    error before any process starts.
  - ``file``: a shared file (``auto``: a temporary file, one node).
  - ``env``: ``MASTER_ADDR`` / ``MASTER_PORT`` from the environment (one node: defaults to
    127.0.0.1 and a free port).
- Under ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` set), this
  process joins torchrun's group instead of spawning; the config's process counts must
  match torchrun's.
- Failures: when a process raises, the others are given a few seconds to stop, then
  terminated; the launcher raises with the traceback of the rank that failed first (a
  :class:`DistributedWorkerError`, or the original :class:`~vissl.errors.VisslError`).
- Preemption: SIGTERM / SIGUSR1 sent to the launcher are forwarded to the workers, which
  checkpoint and exit with :attr:`TrainingPreempted.exit_code`; the launcher then raises
  :class:`~vissl.errors.TrainingPreempted`.
- Every worker imports ``config.IMPORTS`` (and entry-point plugins) before it reads any
  registry, so user train steps, hooks and losses exist in every process.
"""

from __future__ import annotations

import ctypes
import datetime
import json
import logging
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from iopath.common.file_io import g_pathmgr

from vissl.errors import ConfigError, TrainingPreempted, VisslError
from vissl.utils.checkpoint import find_resume_checkpoint, has_final_checkpoint
from vissl.utils.hydra_config import config_to_yaml
from vissl.utils.imports import import_plugins
from vissl.utils.test_utils import find_free_port

logger = logging.getLogger(__name__)

#: How often ``RUN_ID: auto`` tries another port when the one it picked is taken.
AUTO_PORT_ATTEMPTS = 10
#: Seconds the other workers get to stop on their own after one fails, then again
#: after SIGTERM, before SIGKILL.
FAILURE_GRACE_S = 5.0
#: Seconds a worker waits for the rendezvous store of node 0 to come up.
STORE_TIMEOUT_S = 600
#: Environment variables that mean "started by torchrun".
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")

_KEY = "config.DISTRIBUTED"


class DistributedWorkerError(RuntimeError):
    """A spawned worker process failed; the message holds its traceback."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


# ---------------------------------------------------------------------- folders, ids
def get_checkpoint_folder(cfg: Any, dist_run_id: str | None = None) -> str:
    """CHECKPOINT.DIR (plus the run id if APPEND_DISTR_RUN_ID), created if needed."""
    folder = os.path.abspath(str(cfg.CHECKPOINT.DIR))
    if cfg.CHECKPOINT.APPEND_DISTR_RUN_ID and dist_run_id:
        folder = os.path.join(folder, str(dist_run_id).replace(":", "-").replace("/", "_"))
    g_pathmgr.mkdirs(folder)
    return folder


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


def _split_host_port(run_id: str) -> tuple[str, int]:
    host, sep, port = run_id.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"{_KEY}.RUN_ID={run_id!r} is not 'auto' or 'host:port' (e.g. 10.0.0.1:29500). "
            "With INIT_METHOD=tcp give the address of node 0 and a free port.",
            f"{_KEY}.RUN_ID",
        )
    return host, int(port)


def get_dist_run_id(cfg: Any, num_nodes: int) -> str:
    """The rendezvous address for INIT_METHOD/RUN_ID (VISSL's function).

    ``tcp`` with ``auto`` returns ``127.0.0.1:<free port>``; prefer
    :func:`launch_distributed`, which also reserves the port.
    """
    method = cfg.DISTRIBUTED.INIT_METHOD
    run_id = str(cfg.DISTRIBUTED.RUN_ID)
    if method == "tcp":
        if run_id == "auto":
            _require_single_node_for_auto(num_nodes, method)
            return f"127.0.0.1:{find_free_port()}"
        _split_host_port(run_id)
        return run_id
    if method == "file":
        if run_id in ("auto", ""):
            _require_single_node_for_auto(num_nodes, method)
            return os.path.join(tempfile.mkdtemp(prefix="vissl_rendezvous_"), "rendezvous")
        return run_id
    return "env"


def _require_single_node_for_auto(num_nodes: int, method: str) -> None:
    if num_nodes > 1:
        example = "<host of node 0>:<free port>" if method == "tcp" else "<path on a shared disk>"
        raise ConfigError(
            f"{_KEY}.RUN_ID=auto only works on one node: with NUM_NODES={num_nodes} set "
            f"RUN_ID={example}, the same on every node.",
            f"{_KEY}.RUN_ID",
        )


# ---------------------------------------------------------------------- checks
def _check_backend(cfg: Any, world_size: int) -> str:
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


def _check_devices(cfg: Any, nproc: int) -> None:
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


def _check_torchrun(cfg: Any, env: dict[str, int]) -> tuple[int, int]:
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


# ---------------------------------------------------------------------- rendezvous
@dataclass
class _Rendezvous:
    """How workers find each other; node 0's launcher may hold the TCP store."""

    method: str
    run_id: str
    host: str = ""
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    store: Any = None
    cleanup_dir: str | None = None

    def close(self) -> None:
        self.store = None  # the server stops when the last reference goes
        if self.cleanup_dir:
            shutil.rmtree(self.cleanup_dir, ignore_errors=True)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["store"] = None  # workers connect as clients; the store stays here
        return state


def _is_address_in_use(err: BaseException) -> bool:
    text = str(err)
    return "EADDRINUSE" in text or "ddress already in use" in text


def _serve_store(host: str, port: int) -> Any:
    return dist.TCPStore(
        host,
        port,
        None,
        True,
        timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S),
        wait_for_workers=False,
    )


def _make_rendezvous(cfg: Any, node_id: int, num_nodes: int) -> _Rendezvous:
    method = str(cfg.DISTRIBUTED.INIT_METHOD)
    run_id = str(cfg.DISTRIBUTED.RUN_ID)
    if method == "tcp":
        if run_id == "auto":
            _require_single_node_for_auto(num_nodes, method)
            host = "127.0.0.1"
            last: BaseException | None = None
            for attempt in range(AUTO_PORT_ATTEMPTS):
                port = find_free_port()
                try:
                    store = _serve_store(host, port)
                except (RuntimeError, OSError) as err:
                    if not _is_address_in_use(err):
                        raise
                    logger.info("port %d was taken (attempt %d); trying another", port, attempt)
                    last = err
                    continue
                return _Rendezvous(method, f"{host}:{port}", host, port, store=store)
            raise RuntimeError(
                f"no free port found for the rendezvous after {AUTO_PORT_ATTEMPTS} attempts"
            ) from last
        host, port = _split_host_port(run_id)
        store = None
        if node_id == 0:
            try:
                store = _serve_store(host, port)
            except (RuntimeError, OSError) as err:
                if _is_address_in_use(err):
                    raise ConfigError(
                        f"{_KEY}.RUN_ID={run_id}: port {port} is already in use on this "
                        "machine (another run, or a process still holding it). Pick another "
                        f"port, or set {_KEY}.RUN_ID=auto on a single node.",
                        f"{_KEY}.RUN_ID",
                    ) from err
                raise
        return _Rendezvous(method, run_id, host, port, store=store)
    if method == "file":
        cleanup = None
        if run_id in ("auto", ""):
            _require_single_node_for_auto(num_nodes, method)
            cleanup = tempfile.mkdtemp(prefix="vissl_rendezvous_")
            run_id = os.path.join(cleanup, "rendezvous")
        return _Rendezvous(method, os.path.abspath(run_id), cleanup_dir=cleanup)
    # env://
    env: dict[str, str] = {}
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        if num_nodes > 1:
            raise ConfigError(
                f"{_KEY}.INIT_METHOD=env with NUM_NODES={num_nodes} needs MASTER_ADDR and "
                "MASTER_PORT in the environment of every node (the address of node 0 and a "
                f"free port), or use {_KEY}.INIT_METHOD=tcp with RUN_ID=host:port.",
                f"{_KEY}.INIT_METHOD",
            )
        env = {
            "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1"),
            "MASTER_PORT": os.environ.get("MASTER_PORT", str(find_free_port())),
        }
    master = {**os.environ, **env}
    return _Rendezvous(method, f"{master['MASTER_ADDR']}:{master['MASTER_PORT']}", env=env)


def _init_process_group(
    cfg: Any, rdzv: _Rendezvous, rank: int, world_size: int, device: torch.device | None
) -> None:
    backend = str(cfg.DISTRIBUTED.BACKEND)
    kwargs: dict[str, Any] = {"backend": backend, "rank": rank, "world_size": world_size}
    if device is not None and device.type == "cuda" and backend == "nccl":
        kwargs["device_id"] = device
    if rdzv.method == "tcp":
        store = dist.TCPStore(
            rdzv.host,
            rdzv.port,
            None,
            False,
            timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S),
        )
        dist.init_process_group(store=store, **kwargs)
    elif rdzv.method == "file":
        dist.init_process_group(init_method=f"file://{rdzv.run_id}", **kwargs)
    else:
        os.environ.update(rdzv.env)
        dist.init_process_group(init_method="env://", **kwargs)


# ---------------------------------------------------------------------- one worker
def _set_worker_env(rank: int, local_rank: int, world_size: int, nproc: int, node: int) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK=str(node),
    )


def _apply_nccl_env(cfg: Any) -> None:
    if cfg.DISTRIBUTED.NCCL_DEBUG:
        os.environ.setdefault("NCCL_DEBUG", "INFO")
    if str(cfg.DISTRIBUTED.NCCL_SOCKET_NTHREADS):
        os.environ.setdefault("NCCL_SOCKET_NTHREADS", str(cfg.DISTRIBUTED.NCCL_SOCKET_NTHREADS))


def _bind_device(cfg: Any, local_rank: int) -> torch.device | None:
    if cfg.MACHINE.DEVICE == "gpu" and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return None


def _run_engine_in_this_process(
    cfg: Any,
    engine_name: str,
    dist_run_id: str,
    checkpoint_path: str | None,
    checkpoint_folder: str,
    local_rank: int,
    node_id: int,
    hook_generator: Callable[[Any], list[Any]] | None,
) -> Any:
    from vissl.engines import run_engine

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


@dataclass
class _Job:
    """What every spawned worker needs (picklable)."""

    cfg: Any
    engine_name: str
    node_id: int
    world_size: int
    rdzv: _Rendezvous
    checkpoint_path: str | None
    checkpoint_folder: str
    hook_generator: Callable[[Any], list[Any]] | None
    error_dir: str


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
    # The launcher forwards preemption signals; until the trainer installs its own
    # handlers, they have their default effect here. A fork inherits the parent's
    # Python handlers (e.g. submitit's), which must not run in a worker.
    for name in ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGCONT"):
        signum = getattr(signal, name, None)
        if signum is not None:
            signal.signal(signum, signal.SIG_DFL)
    if "SUBMITIT_EXECUTOR" in os.environ:
        # submitit's preemption signal is handled by the launcher, not by workers.
        name = "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
        signum = getattr(signal, name, None)
        if signum is not None:
            signal.signal(signum, signal.SIG_IGN)


def _write_error(job: _Job, rank: int, err: BaseException) -> None:
    tb = traceback.format_exc()
    record = {
        "rank": rank,
        "time": time.time(),
        "type": type(err).__name__,
        "message": str(err),
        "traceback": tb,
        "communication": _is_communication_error(err),
    }
    path = os.path.join(job.error_dir, f"rank{rank}")
    try:
        with open(path + ".json", "w", encoding="utf-8") as f:
            json.dump(record, f)
        if isinstance(err, VisslError):
            with open(path + ".pickle", "wb") as f:
                pickle.dump(err, f)
    except Exception:  # reporting must never hide the error itself
        pass


def _is_communication_error(err: BaseException) -> bool:
    if isinstance(err, dist.DistError):
        return True
    text = str(err)
    return any(
        s in text
        for s in (
            "Connection closed by peer",
            "Connection reset by peer",
            "Broken pipe",
            "Socket Timeout",
        )
    )


def _worker_threads(cfg: Any, nproc: int) -> int:
    """Intra-op threads of a worker.

    ``fork``: one, as in PyTorch's DataLoader workers: OpenMP (libgomp) is not fork-safe,
    and a forked child of a process that already ran multi-threaded ops hangs in its
    first multi-threaded op. ``forkserver`` / ``spawn``: the node's cores shared out.
    """
    if str(cfg.MULTI_PROCESSING_METHOD) == "fork":
        return 1
    if cfg.MACHINE.DEVICE != "cpu":
        return torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return max(1, (cores or os.cpu_count() or 1) // nproc)


def _worker_main(local_rank: int, job: _Job) -> None:
    """Entry point of a spawned worker: set up, join the group, run the engine.

    Exit codes: 0 done, :attr:`TrainingPreempted.exit_code` stopped for preemption after
    a checkpoint, 1 failed (the traceback goes to stderr and to ``job.error_dir``).
    """
    _die_with_parent()
    _reset_worker_signals()
    cfg = job.cfg
    nproc = int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)
    rank = job.node_id * nproc + local_rank
    code = 0
    try:
        _set_worker_env(rank, local_rank, job.world_size, nproc, job.node_id)
        _apply_nccl_env(cfg)
        import_plugins(cfg.IMPORTS or [])
        torch.set_num_threads(_worker_threads(cfg, nproc))
        device = _bind_device(cfg, local_rank)
        _init_process_group(cfg, job.rdzv, rank, job.world_size, device)
        _run_engine_in_this_process(
            cfg,
            job.engine_name,
            job.rdzv.run_id,
            job.checkpoint_path,
            job.checkpoint_folder,
            local_rank,
            job.node_id,
            job.hook_generator,
        )
    except TrainingPreempted:
        code = TrainingPreempted.exit_code
    except SystemExit:
        raise
    except BaseException as err:
        _write_error(job, rank, err)
        print(
            f"vissl: rank {rank} (node {job.node_id}, local rank {local_rank}) failed:\n"
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


# ---------------------------------------------------------------------- the worker group
_PRELOAD = (
    "vissl.utils.distributed_launcher",
    "vissl.engines",
    "vissl.trainer.train_steps",
    "vissl.hooks",
    "vissl.models",
    "vissl.losses",
    "vissl.data",
    "vissl.meters",
    "vissl.optimizers",
)


class _WorkerGroup:
    """The spawned workers of this node, their failures and their preemption."""

    def __init__(self, job: _Job, nproc: int, start_method: str) -> None:
        self.job = job
        self.nproc = nproc
        self.start_method = start_method
        self.processes: list[Any] = []
        self.preemption_requested = False

    def start(self) -> None:
        ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":
            # Workers fork from a server that imported torch and vissl once, instead of
            # each importing them (seconds each); only effective before it starts.
            ctx.set_forkserver_preload(list(_PRELOAD))  # type: ignore[attr-defined]
        for local_rank in range(self.nproc):
            p = ctx.Process(  # type: ignore[attr-defined]
                target=_worker_main, args=(local_rank, self.job), daemon=False
            )
            try:
                p.start()
            except (pickle.PicklingError, AttributeError, TypeError) as err:
                if self.start_method == "fork":
                    raise
                raise ConfigError(
                    f"config.MULTI_PROCESSING_METHOD={self.start_method} sends the config "
                    f"and hook_generator to each worker by pickling, which failed: {err}. "
                    "Pass a module-level function as hook_generator (not a lambda or a "
                    "local function), or use MULTI_PROCESSING_METHOD=fork.",
                    "config.MULTI_PROCESSING_METHOD",
                ) from err
            self.processes.append(p)

    def alive(self) -> list[Any]:
        return [p for p in self.processes if p.exitcode is None]

    def send(self, signum: int) -> None:
        for p in self.alive():
            try:
                os.kill(p.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> bool:
        """Wait until every worker has exited or ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        while self.alive():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            multiprocessing.connection.wait([p.sentinel for p in self.alive()], timeout=left)
        return True

    def stop(self) -> None:
        """SIGTERM, a grace period, then SIGKILL for whatever is still running."""
        if not self.alive():
            return
        self.send(signal.SIGTERM)
        if not self.wait(FAILURE_GRACE_S):
            self.send(signal.SIGKILL)
            self.wait(FAILURE_GRACE_S)

    def request_preemption(self, signum: int = signal.SIGUSR1) -> None:
        self.preemption_requested = True
        self.send(signum)

    def _is_preempted_exit(self, code: int | None) -> bool:
        if code == TrainingPreempted.exit_code:
            return True
        # Killed by the signal we forwarded before the trainer could handle it.
        return self.preemption_requested and code is not None and code < 0

    def _failed(self) -> list[Any]:
        return [
            p
            for p in self.processes
            if p.exitcode not in (None, 0) and not self._is_preempted_exit(p.exitcode)
        ]

    def join(self) -> None:
        """Wait for the workers; raise on failure or preemption."""
        with self._forward_signals():
            while self.alive() and not self._failed():
                multiprocessing.connection.wait([p.sentinel for p in self.alive()], timeout=1.0)
            if self._failed() and self.alive():
                # Give the others a moment to notice (gloo fails fast on a dead peer).
                if not self.wait(FAILURE_GRACE_S):
                    self.stop()
        failed = self._failed()
        if failed:
            raise self._failure(failed)
        if any(self._is_preempted_exit(p.exitcode) for p in self.processes):
            raise TrainingPreempted(
                f"the workers of node {self.job.node_id} stopped for preemption after "
                "saving a checkpoint"
            )

    @contextmanager
    def _forward_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def forward(signum: int, frame: Any) -> None:
            logger.warning("%s received: forwarding it to the workers", signal.Signals(signum).name)
            self.request_preemption(signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _rank_of(self, p: Any) -> int:
        return self.job.node_id * self.nproc + self.processes.index(p)

    def _failure(self, failed: list[Any]) -> BaseException:
        """The error to raise: the traceback of the rank that failed first.

        A rank's own error wins over the communication errors of the ranks that lost
        their peer; a rank that died without a traceback (killed, native crash) wins over
        communication errors too.
        """
        records = []
        for name in os.listdir(self.job.error_dir):
            if name.endswith(".json"):
                with open(os.path.join(self.job.error_dir, name), encoding="utf-8") as f:
                    records.append(json.load(f))
        records.sort(key=lambda r: (r["communication"], r["time"]))
        with_record = {int(r["rank"]) for r in records}
        silent = [p for p in failed if self._rank_of(p) not in with_record]
        lines = [
            f"rank {r['rank']}: {r['type']}: {(r['message'] or '').splitlines()[0] if r['message'] else ''}"
            for r in records
        ]
        for p in silent:
            lines.append(f"rank {self._rank_of(p)}: {_describe_exit(p.exitcode)}")
        if silent and (not records or records[0]["communication"]):
            p = silent[0]
            rank = self._rank_of(p)
            message = (
                f"rank {rank} of {self.job.world_size} (node {self.job.node_id}) "
                f"{_describe_exit(p.exitcode)} without a Python traceback (out of memory? a "
                "crash in native code? killed?). See its log."
            )
            others = [line for line in lines if not line.startswith(f"rank {rank}:")]
            if others:
                message += "\nother ranks:\n  " + "\n  ".join(others)
            return DistributedWorkerError(message, rank)
        first = records[0]
        rank = int(first["rank"])
        message = (
            f"rank {rank} of {self.job.world_size} (node {self.job.node_id}, local rank "
            f"{rank - self.job.node_id * self.nproc}) failed:\n{first['traceback']}"
        )
        if len(lines) > 1:
            message += "\nother ranks stopped as a consequence:\n  " + "\n  ".join(lines[1:])
        if first["communication"]:
            message += (
                "\n(a communication error: a process on another node may have failed first; "
                "see that node's log)"
            )
        error = DistributedWorkerError(message, rank)
        pickled = os.path.join(self.job.error_dir, f"rank{rank}.pickle")
        if os.path.exists(pickled):
            try:
                with open(pickled, "rb") as f:
                    original = pickle.load(f)
                if isinstance(original, VisslError):
                    original.__cause__ = error
                    return original  # type: ignore[no-any-return]
            except Exception:
                pass
        return error


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


#: The worker group running on this node, for the SLURM preemption handler.
_ACTIVE_GROUP: _WorkerGroup | None = None


def stop_workers_for_preemption(timeout: float) -> bool:
    """Ask this node's workers to checkpoint and exit (SIGUSR1); wait up to ``timeout``.

    Returns True when no worker is left running (they are killed after ``timeout``).
    Safe to call from a signal handler; a no-op when no worker runs.
    """
    group = _ACTIVE_GROUP
    if group is None or not group.alive():
        return True
    group.request_preemption(signal.SIGUSR1)
    if group.wait(timeout):
        return True
    logger.warning("workers did not stop within %.0f s after SIGUSR1; killing them", timeout)
    group.send(signal.SIGKILL)
    group.wait(FAILURE_GRACE_S)
    return False


# ---------------------------------------------------------------------- entry point
def _prepare_run(
    cfg: Any, engine_name: str, dist_run_id: str, write_config: bool
) -> tuple[str, str | None, bool]:
    """(checkpoint folder, checkpoint to resume from, whether training already finished)."""
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
            return folder, None, True
        if cfg.CHECKPOINT.AUTO_RESUME and not has_final_checkpoint(folder):
            checkpoint_path = find_resume_checkpoint(
                folder, int(cfg.CHECKPOINT.LATEST_CHECKPOINT_RESUME_FILE_NUM)
            )
        if write_config:
            with open(os.path.join(folder, "train_config.yaml"), "w", encoding="utf-8") as f:
                f.write(config_to_yaml(cfg))
    return folder, checkpoint_path, False


def _launch_under_torchrun(
    cfg: Any,
    env: dict[str, int],
    engine_name: str,
    hook_generator: Callable[[Any], list[Any]] | None,
) -> Any:
    node_id, nproc = _check_torchrun(cfg, env)
    rank, world_size, local_rank = env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]
    _check_backend(cfg, world_size)
    _check_devices(cfg, nproc)
    run_id = f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '')}"
    folder, checkpoint_path, done = _prepare_run(cfg, engine_name, run_id, rank == 0)
    if done:
        return None
    logger.info(
        "torchrun: rank %d of %d (node %d, local rank %d)", rank, world_size, node_id, local_rank
    )
    import_plugins(cfg.IMPORTS or [])
    _apply_nccl_env(cfg)
    device = _bind_device(cfg, local_rank)
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
        return _run_engine_in_this_process(
            cfg,
            engine_name,
            run_id,
            checkpoint_path,
            folder,
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
    _check_backend(cfg, world_size)
    _check_devices(cfg, nproc)

    if world_size == 1 and not always_spawn:
        folder, checkpoint_path, done = _prepare_run(cfg, engine_name, "local", True)
        if done:
            return None
        import_plugins(cfg.IMPORTS or [])
        return _run_engine_in_this_process(
            cfg, engine_name, "local", checkpoint_path, folder, 0, node_id, hook_generator
        )

    rdzv = _make_rendezvous(cfg, node_id, num_nodes)
    error_dir = tempfile.mkdtemp(prefix="vissl_worker_errors_")
    global _ACTIVE_GROUP
    try:
        folder, checkpoint_path, done = _prepare_run(cfg, engine_name, rdzv.run_id, node_id == 0)
        if done:
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
        job = _Job(
            cfg,
            engine_name,
            node_id,
            world_size,
            rdzv,
            checkpoint_path,
            folder,
            hook_generator,
            error_dir,
        )
        # Import vissl's and the user's plugins once here: forked workers inherit them.
        import_plugins(cfg.IMPORTS or [])
        group = _WorkerGroup(job, nproc, str(cfg.MULTI_PROCESSING_METHOD))
        _ACTIVE_GROUP = group
        try:
            group.start()
            group.join()
        finally:
            group.stop()
            _ACTIVE_GROUP = None
    finally:
        rdzv.close()
        shutil.rmtree(error_dir, ignore_errors=True)
    return None

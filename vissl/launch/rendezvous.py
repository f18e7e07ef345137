"""Rendezvous: how the processes of a run find each other (``INIT_METHOD`` / ``RUN_ID``).

- ``tcp``: ``RUN_ID: auto`` (one node) picks a free port, retried if it is taken before
  use; ``RUN_ID: host:port`` (several nodes: the host of node 0, the same on every node).
  Node 0's launcher holds the rendezvous store itself, so a busy explicit port is a clear
  error before any process starts.
- ``file``: a shared file (``auto``: a temporary file, one node).
- ``env``: ``MASTER_ADDR`` / ``MASTER_PORT`` from the environment (one node: defaults to
  127.0.0.1 and a free port).
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from vissl.errors import ConfigError
from vissl.utils.distributed import find_free_port

logger = logging.getLogger(__name__)

#: How often ``RUN_ID: auto`` tries another port when the one it picked is taken.
AUTO_PORT_ATTEMPTS = 10
#: Seconds a worker waits for the rendezvous store of node 0 to come up.
STORE_TIMEOUT_S = 600

_KEY = "config.DISTRIBUTED"


def _split_host_port(run_id: str) -> tuple[str, int]:
    host, sep, port = run_id.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"{_KEY}.RUN_ID={run_id!r} is not 'auto' or 'host:port' (e.g. 10.0.0.1:29500). "
            "With INIT_METHOD=tcp give the address of node 0 and a free port.",
            f"{_KEY}.RUN_ID",
        )
    return host, int(port)


def _require_single_node_for_auto(num_nodes: int, method: str) -> None:
    if num_nodes > 1:
        example = "<host of node 0>:<free port>" if method == "tcp" else "<path on a shared disk>"
        raise ConfigError(
            f"{_KEY}.RUN_ID=auto only works on one node: with NUM_NODES={num_nodes} set "
            f"RUN_ID={example}, the same on every node.",
            f"{_KEY}.RUN_ID",
        )


@dataclass
class Rendezvous:
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


def make_rendezvous(cfg: Any, node_id: int, num_nodes: int) -> Rendezvous:
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
                return Rendezvous(method, f"{host}:{port}", host, port, store=store)
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
        return Rendezvous(method, run_id, host, port, store=store)
    if method == "file":
        cleanup = None
        if run_id in ("auto", ""):
            _require_single_node_for_auto(num_nodes, method)
            cleanup = tempfile.mkdtemp(prefix="vissl_rendezvous_")
            run_id = os.path.join(cleanup, "rendezvous")
        return Rendezvous(method, os.path.abspath(run_id), cleanup_dir=cleanup)
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
    return Rendezvous(method, f"{master['MASTER_ADDR']}:{master['MASTER_PORT']}", env=env)


def init_process_group(
    cfg: Any, rdzv: Rendezvous, rank: int, world_size: int, device: torch.device | None
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

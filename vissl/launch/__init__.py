"""Launching runs: one process, N processes per node, several nodes, torchrun, SLURM.

Which file does what:

- :mod:`~vissl.launch.launcher`: ``launch_distributed`` (the entry point), the run folder,
  the resume choice and the :class:`~vissl.engines.run_context.RunContext`; torchrun.
- :mod:`~vissl.launch.run_lock`: the lock of a run folder (one live run per
  ``CHECKPOINT.DIR``; stale locks of dead runs are taken over).
- :mod:`~vissl.launch.run_folder`: what a training run does with its folder (finished,
  resume, or start afresh with an older run moved aside).
- :mod:`~vissl.launch.checks`: backend and devices against the machine, torchrun's
  environment, node ids.
- :mod:`~vissl.launch.rendezvous`: how processes find each other (tcp, file, env).
- :mod:`~vissl.launch.worker`: one worker process (environment, threads, device, process
  group, engine, error file).
- :mod:`~vissl.launch.supervision`: the workers of a node: failures, preemption signals.
- :mod:`~vissl.launch.slurm`: submitit jobs with requeue on preemption.
"""

from __future__ import annotations

from vissl.launch.launcher import (
    get_checkpoint_folder,
    launch_distributed,
    prepare_run,
    run_folder_lock,
)
from vissl.launch.run_lock import RunLock
from vissl.launch.supervision import DistributedWorkerError, stop_workers_for_preemption
from vissl.utils.distributed import find_free_port

__all__ = [
    "DistributedWorkerError",
    "RunLock",
    "find_free_port",
    "get_checkpoint_folder",
    "launch_distributed",
    "prepare_run",
    "run_folder_lock",
    "stop_workers_for_preemption",
]

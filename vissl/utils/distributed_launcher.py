"""VISSL's import path of the launcher; the code lives in :mod:`vissl.launch`."""

from __future__ import annotations

from vissl.launch.checks import get_node_id, torchrun_environment
from vissl.launch.launcher import get_checkpoint_folder, launch_distributed
from vissl.launch.supervision import DistributedWorkerError, stop_workers_for_preemption

__all__ = [
    "DistributedWorkerError",
    "get_checkpoint_folder",
    "get_node_id",
    "launch_distributed",
    "stop_workers_for_preemption",
    "torchrun_environment",
]

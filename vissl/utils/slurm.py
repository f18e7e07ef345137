"""VISSL's import path of the SLURM launcher; the code lives in :mod:`vissl.launch.slurm`."""

from __future__ import annotations

from vissl.launch.slurm import (
    ResumableSlurmJob,
    create_submitit_executor,
    launch_distributed_on_slurm,
    slurm_parameters,
)

__all__ = [
    "ResumableSlurmJob",
    "create_submitit_executor",
    "launch_distributed_on_slurm",
    "slurm_parameters",
]

"""SLURM through submitit (``SLURM.USE_SLURM``): submit, run one task per node, requeue.

``launch_distributed_on_slurm(cfg, engine_name)`` submits one job of ``NUM_NODES`` nodes
with one task per node; each task runs :func:`launch_distributed` for its node (node index
from SLURM's environment), which spawns ``NUM_PROC_PER_NODE`` workers. Several nodes meet
over TCP at ``<first host of the job>:SLURM.PORT_ID``; one node uses a free local port.

Preemption and time limits: SLURM sends submitit's signal (``USR2``,
``slurm_signal_delay_s`` before the limit; on preemption where the cluster sets
``preempt_send_user_signal``). The task then asks its workers to stop (SIGUSR1): they
finish the current step, save an iteration checkpoint and exit with
:attr:`TrainingPreempted.exit_code`. Then submitit calls :meth:`ResumableSlurmJob.checkpoint`,
which resubmits the same job with ``CHECKPOINT.AUTO_RESUME=True``; the requeued job
resumes from the newest checkpoint. Workers stopped by a SIGTERM sent to them directly
also lead to a requeue.

Keys: ``SLURM.NAME, PARTITION, COMMENT, CONSTRAINT, TIME_HOURS, TIME_MINUTES, MEM_GB,
PORT_ID, NUM_CPU_PER_PROC, LOG_FOLDER, ADDITIONAL_PARAMETERS``.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import signal
from collections.abc import Callable
from typing import Any

from vissl.errors import ConfigError, TrainingPreempted
from vissl.launch.checks import make_checkpoint_folder
from vissl.launch.launcher import launch_distributed
from vissl.launch.supervision import stop_workers_for_preemption

logger = logging.getLogger(__name__)

#: Seconds the workers get to checkpoint after the preemption signal (submitit's default
#: signal comes 90 s before the end of the job).
PREEMPTION_TIMEOUT_S = 60.0


def _submitit() -> Any:
    try:
        import submitit
    except ImportError as err:  # pragma: no cover - submitit is a dependency
        raise ConfigError(
            "config.SLURM.USE_SLURM=True needs submitit: pip install submitit.",
            "config.SLURM.USE_SLURM",
        ) from err
    return submitit


def _absolute_paths(cfg: Any) -> Any:
    """A copy of ``cfg`` whose folders do not depend on the job's working directory."""
    cfg = copy.deepcopy(cfg)
    cfg.CHECKPOINT.DIR = os.path.abspath(str(cfg.CHECKPOINT.DIR))
    cfg.SLURM.LOG_FOLDER = os.path.abspath(str(cfg.SLURM.LOG_FOLDER))
    cfg.IMPORTS = [
        os.path.abspath(i) if (str(i).endswith(".py") or os.sep in str(i)) else i
        for i in (cfg.IMPORTS or [])
    ]
    return cfg


def slurm_parameters(cfg: Any) -> dict[str, Any]:
    """submitit ``AutoExecutor.update_parameters`` arguments for this config."""
    s = cfg.SLURM
    nproc = int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)
    timeout_min = round(float(s.TIME_HOURS) * 60 + int(s.get("TIME_MINUTES", 0)))
    if timeout_min <= 0:
        raise ConfigError(
            f"config.SLURM.TIME_HOURS={s.TIME_HOURS} and TIME_MINUTES="
            f"{s.get('TIME_MINUTES', 0)} give no time for the job: set a positive limit.",
            "config.SLURM.TIME_HOURS",
        )
    params: dict[str, Any] = {
        "name": str(s.NAME),
        "nodes": int(cfg.DISTRIBUTED.NUM_NODES),
        "tasks_per_node": 1,
        "gpus_per_node": nproc if cfg.MACHINE.DEVICE == "gpu" else 0,
        "cpus_per_task": int(s.NUM_CPU_PER_PROC) * nproc,
        "mem_gb": math.ceil(float(s.MEM_GB)),
        "timeout_min": timeout_min,
        "slurm_additional_parameters": dict(s.ADDITIONAL_PARAMETERS or {}),
    }
    for key, name in (("PARTITION", "partition"), ("COMMENT", "comment")):
        if str(s[key]):
            params[f"slurm_{name}"] = str(s[key])
    if str(s.CONSTRAINT):
        params["slurm_constraint"] = str(s.CONSTRAINT)
    return params


def create_submitit_executor(cfg: Any, cluster: str | None = None) -> Any:
    """A submitit ``AutoExecutor`` with the job's resources (VISSL's function).

    Args:
        cfg: the ``config`` section.
        cluster: submitit's cluster (``None``: SLURM when available; ``"local"`` runs the
            job on this machine, for tests).
    """
    submitit = _submitit()
    executor = submitit.AutoExecutor(folder=str(cfg.SLURM.LOG_FOLDER), cluster=cluster)
    executor.update_parameters(**slurm_parameters(cfg))
    return executor


class ResumableSlurmJob:
    """The function a SLURM task runs; resubmits itself on preemption or timeout.

    Args:
        cfg: the ``config`` section.
        engine_name: the engine to run (``train``, ...).
        hook_generator: ``cfg -> hooks`` (picklable: a module-level function).
    """

    def __init__(
        self,
        cfg: Any,
        engine_name: str = "train",
        hook_generator: Callable[[Any], list[Any]] | None = None,
    ) -> None:
        self.cfg = cfg
        self.engine_name = engine_name
        self.hook_generator = hook_generator

    def __call__(self) -> None:
        submitit = _submitit()
        job_env = submitit.JobEnvironment()
        cfg = copy.deepcopy(self.cfg)
        num_nodes = int(cfg.DISTRIBUTED.NUM_NODES)
        if job_env.num_nodes != num_nodes:
            raise ConfigError(
                f"the SLURM job has {job_env.num_nodes} nodes but "
                f"config.DISTRIBUTED.NUM_NODES={num_nodes}; do not override the node count "
                "in config.SLURM.ADDITIONAL_PARAMETERS.",
                "config.DISTRIBUTED.NUM_NODES",
            )
        cfg.DISTRIBUTED.INIT_METHOD = "tcp"
        if num_nodes > 1:
            cfg.DISTRIBUTED.RUN_ID = f"{job_env.hostnames[0]}:{int(cfg.SLURM.PORT_ID)}"
        else:
            cfg.DISTRIBUTED.RUN_ID = "auto"
        logger.info(
            "SLURM task: %s, node %d of %d, rendezvous %s",
            job_env,
            job_env.node,
            num_nodes,
            cfg.DISTRIBUTED.RUN_ID,
        )
        usr_sig = getattr(signal, "SIG" + submitit.JobEnvironment.USR_SIG)
        previous = signal.getsignal(usr_sig)
        signal.signal(usr_sig, _PreemptionSignalHandler(previous))
        try:
            launch_distributed(
                cfg,
                node_id=job_env.node,
                engine_name=self.engine_name,
                hook_generator=self.hook_generator,
                always_spawn=True,
            )
        except TrainingPreempted:
            # The workers were stopped by a signal sent to them directly (SIGTERM):
            # requeue through submitit's own handler, as for its signal.
            logger.warning("workers stopped for preemption: requeuing the job")
            os.kill(os.getpid(), usr_sig)
            raise
        finally:
            if previous is not None:
                signal.signal(usr_sig, previous)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Called by submitit on preemption/timeout: the job to requeue (resumes)."""
        submitit = _submitit()
        cfg = copy.deepcopy(self.cfg)
        if not cfg.CHECKPOINT.AUTO_RESUME:
            logger.warning("requeued job: setting config.CHECKPOINT.AUTO_RESUME=True to resume")
        cfg.CHECKPOINT.AUTO_RESUME = True
        logger.info(
            "requeuing; the job resumes from the newest checkpoint in %s", cfg.CHECKPOINT.DIR
        )
        requeued = type(self)(cfg, self.engine_name, self.hook_generator)
        return submitit.helpers.DelayedSubmission(requeued, *args, **kwargs)


class _PreemptionSignalHandler:
    """Stop this node's workers (they checkpoint), then run submitit's handler."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.running = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.running:
            return
        self.running = True
        try:
            logger.warning(
                "%s received: stopping the workers (checkpoint), then requeuing",
                signal.Signals(signum).name,
            )
            stop_workers_for_preemption(PREEMPTION_TIMEOUT_S)
            if callable(self.previous):
                self.previous(signum, frame)
        finally:
            self.running = False


def launch_distributed_on_slurm(
    cfg: Any,
    engine_name: str = "train",
    hook_generator: Callable[[Any], list[Any]] | None = None,
    cluster: str | None = None,
) -> Any:
    """Submit the run to SLURM (VISSL's function); returns the submitit job.

    Args:
        cfg: the validated ``config`` section (``SLURM.*`` and ``DISTRIBUTED.*``).
        engine_name: the engine to run.
        hook_generator: ``cfg -> hooks`` (picklable); None: ``default_hook_generator``.
        cluster: submitit's cluster; ``"local"`` runs the job on this machine.
    """
    cfg = _absolute_paths(cfg)
    make_checkpoint_folder(str(cfg.CHECKPOINT.DIR))  # a bad folder fails here, not in the job
    executor = create_submitit_executor(cfg, cluster)
    job = executor.submit(ResumableSlurmJob(cfg, engine_name, hook_generator))
    message = (
        f"vissl: submitted job {job.job_id} ({cfg.SLURM.NAME}, {cfg.DISTRIBUTED.NUM_NODES} "
        f"node(s) x {cfg.DISTRIBUTED.NUM_PROC_PER_NODE} process(es)); submitit logs in "
        f"{cfg.SLURM.LOG_FOLDER}, checkpoints in {cfg.CHECKPOINT.DIR}"
    )
    logger.info(message)
    print(message)
    return job

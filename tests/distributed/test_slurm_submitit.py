"""SLURM through submitit: job resources, and preemption -> checkpoint -> requeue -> resume,
exercised with submitit's local executor (a real job process, real signals)."""

from __future__ import annotations

import os
import re
import stat

import pytest

from tests.integration._runs import REPO
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.slurm import create_submitit_executor, launch_distributed_on_slurm

PLUGIN = os.path.join(REPO, "tests", "distributed", "plugins", "dist_test_hooks.py")
TINY = "config=test/cpu_test/tiny_simclr"


def test_sbatch_script_has_the_config_resources(tmp_path, monkeypatch):
    # submitit's SLURM executor only needs an ``srun`` on PATH to write the script.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    srun = fake_bin / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    _, cfg = hydra_compose_and_validate(
        [
            TINY,
            "config.SLURM.USE_SLURM=true",
            "config.SLURM.NAME=ssl_run",
            "config.SLURM.PARTITION=learnlab",
            "config.SLURM.COMMENT=my comment",
            "config.SLURM.CONSTRAINT=volta32gb",
            "config.SLURM.TIME_HOURS=2",
            "config.SLURM.MEM_GB=120",
            "config.SLURM.NUM_CPU_PER_PROC=4",
            "+config.SLURM.ADDITIONAL_PARAMETERS={account: my_account}",
            f"config.SLURM.LOG_FOLDER={tmp_path / 'logs'}",
            "config.MACHINE.DEVICE=gpu",
            "config.DISTRIBUTED.BACKEND=nccl",
            "config.DISTRIBUTED.NUM_NODES=2",
            "config.DISTRIBUTED.NUM_PROC_PER_NODE=8",
        ]
    )
    executor = create_submitit_executor(cfg, cluster="slurm")
    script = executor._executor._make_submission_file_text("python job.py", "uid")
    for line in (
        "#SBATCH --job-name=ssl_run",
        "#SBATCH --partition=learnlab",
        "#SBATCH --comment=",
        "#SBATCH --constraint=volta32gb",
        "#SBATCH --time=120",
        "#SBATCH --mem=120GB",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=32",
        "#SBATCH --account=my_account",
        "#SBATCH --signal=USR2@",
    ):
        assert line in script, f"{line!r} not in:\n{script}"


@pytest.mark.slow
@pytest.mark.integration
def test_preempted_job_requeues_and_finishes_from_its_checkpoint(tmp_path):
    """A preemption signal mid-run: the workers checkpoint, the job is requeued by
    submitit and the new job auto-resumes from that checkpoint to the end."""
    ckpt = tmp_path / "ckpt"
    _, cfg = hydra_compose_and_validate(
        [
            TINY,
            "config.SLURM.USE_SLURM=true",
            f"config.SLURM.LOG_FOLDER={tmp_path / 'slurm'}",
            "config.SLURM.TIME_HOURS=1",
            "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
            "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2",
            "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
            "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 32]}]]",
            "config.CHECKPOINT.AUTO_RESUME=True",
            f"config.CHECKPOINT.DIR={ckpt}",
            f"config.IMPORTS=[{PLUGIN}]",
            # rank 0 signals the job's task as SLURM would (once: a marker file)
            "config.HOOKS.CUSTOM_HOOKS=[{name: signal_launcher_once, iteration: 3}]",
        ]
    )
    job = launch_distributed_on_slurm(cfg, cluster="local")
    job.wait()
    out = job.stdout() or ""
    err = job.stderr() or ""
    assert job.state == "FINISHED", err[-4000:]
    job.result()  # raises if the job failed
    assert "Requeued job" in err + out, (out + err)[-4000:]
    assert (ckpt / "preempted_once").exists()
    saved_at = int((ckpt / "preempted_once").read_text())
    log = (ckpt / "log.txt").read_text()
    # The requeued job resumed from the checkpoint written on preemption: ranks agree on a
    # stop within a few steps or at the phase end (here the phase has 4 steps), so the
    # checkpoint is an iteration or a phase checkpoint written after the signal.
    resumed = [line for line in log.splitlines() if "resuming from" in line]
    assert resumed, log[-3000:]
    found = re.search(r"\(iteration (\d+)\)", resumed[-1])
    assert found, resumed[-1]
    iteration = int(found.group(1))
    assert saved_at <= iteration < 8, resumed[-1]
    assert (ckpt / "model_final_checkpoint_phase1.torch").exists()


def test_node_id_comes_from_srun_on_several_nodes(monkeypatch):
    from vissl.utils.distributed_launcher import get_node_id

    monkeypatch.setenv("SLURM_STEP_NODELIST", "node[1-2]")
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert get_node_id(0, num_nodes=2) == 1
    assert get_node_id(0, num_nodes=1) == 0  # one node: always 0
    assert get_node_id(1, num_nodes=2) == 1

"""Launcher failure behaviour: a failing rank, busy ports, impossible settings, torchrun
mismatches, and a preemption signal sent to the launcher."""

from __future__ import annotations

import os
import socket
import time

import pytest

from tests.integration._runs import REPO, run_config
from vissl.errors import ConfigError, TrainingPreempted
from vissl.launch import rendezvous
from vissl.launch.rendezvous import make_rendezvous
from vissl.utils.distributed_launcher import DistributedWorkerError, launch_distributed
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import find_free_port

PLUGIN = os.path.join(REPO, "tests", "distributed", "plugins", "dist_test_hooks.py")
TINY = "test/cpu_test/tiny_simclr"
TWO = ["config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2"]
# A narrow ResNet-18 (a quarter of the width): the same code paths, less to compute.
SMALL = [
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
    "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 32]}]]",
]


def _cfg(*overrides: str):
    return hydra_compose_and_validate([f"config={TINY}", *overrides])[1]


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_raising_rank_stops_every_rank_within_60s_with_its_traceback(tmp_path):
    start = time.monotonic()
    with pytest.raises(DistributedWorkerError) as info:
        run_config(
            TINY,
            *TWO,
            *SMALL,
            f"config.IMPORTS=[{PLUGIN}]",
            "config.HOOKS.CUSTOM_HOOKS=[{name: raise_on_rank, rank: 1, iteration: 2}]",
            f"config.CHECKPOINT.DIR={tmp_path}",
        )
    # launch_distributed returns only once every worker has exited.
    assert time.monotonic() - start < 60
    message = str(info.value)
    assert info.value.rank == 1
    assert message.startswith("rank 1 of 2 (node 0, local rank 1) failed")
    assert "RuntimeError: deliberate failure on rank 1 at iteration 2" in message
    assert "dist_test_hooks.py" in message  # the failing rank's own traceback
    assert not list(tmp_path.glob("model_final*"))


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_killed_rank_is_reported_with_its_signal(tmp_path):
    start = time.monotonic()
    with pytest.raises(DistributedWorkerError) as info:
        run_config(
            TINY,
            *TWO,
            *SMALL,
            f"config.IMPORTS=[{PLUGIN}]",
            "config.HOOKS.CUSTOM_HOOKS=[{name: kill_rank, rank: 1, iteration: 2}]",
            f"config.CHECKPOINT.DIR={tmp_path}",
        )
    assert time.monotonic() - start < 60
    assert str(info.value).startswith("rank 1 of 2 (node 0) was killed by signal SIGKILL")


def test_cli_exit_codes(monkeypatch, capsys):
    """The CLI: 1 when a process failed (its error printed), 75 when preempted."""
    from vissl.launch import cli

    def fail(overrides):
        raise DistributedWorkerError("rank 1 of 2 (node 0, local rank 1) failed:\nTraceback", 1)

    monkeypatch.setattr(cli, "hydra_main", fail)
    assert cli.main() == 1
    assert "rank 1 of 2 (node 0, local rank 1) failed" in capsys.readouterr().err

    def preempted(overrides):
        raise TrainingPreempted("stopped by SIGTERM")

    monkeypatch.setattr(cli, "hydra_main", preempted)
    assert cli.main() == TrainingPreempted.exit_code == 75


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_config_error_in_a_worker_is_raised_as_such(tmp_path):
    # 4 samples over 2 ranks with batch 4: no batch on any rank (found while building).
    with pytest.raises(ConfigError, match="BATCHSIZE_PER_REPLICA") as info:
        run_config(
            TINY,
            "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
            "config.DATA.TRAIN.DATA_LIMIT=4",
            f"config.CHECKPOINT.DIR={tmp_path}",
        )
    assert "rank 0 of 2" in str(info.value.__cause__) or "rank 1 of 2" in str(info.value.__cause__)


def test_busy_explicit_port_is_a_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = _cfg(
            *TWO, f"config.DISTRIBUTED.RUN_ID=127.0.0.1:{port}", f"config.CHECKPOINT.DIR={tmp_path}"
        )
        with pytest.raises(ConfigError, match=f"port {port} is already in use") as info:
            launch_distributed(cfg)
    assert info.value.key_path == "config.DISTRIBUTED.RUN_ID"


def test_busy_port_with_run_id_auto_is_retried(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        free = find_free_port()
        ports = iter([busy, busy, free])
        monkeypatch.setattr(rendezvous, "find_free_port", lambda: next(ports))
        rdzv = make_rendezvous(_cfg(*TWO), node_id=0, num_nodes=1)
        try:
            assert rdzv.run_id == f"127.0.0.1:{free}"
        finally:
            rdzv.close()


@pytest.mark.parametrize(
    "overrides,key,text",
    [
        (["config.DISTRIBUTED.BACKEND=nccl"], "config.DISTRIBUTED.BACKEND", "BACKEND=gloo"),
        (["config.DISTRIBUTED.RUN_ID=somehost"], "config.DISTRIBUTED.RUN_ID", "host:port"),
        (
            ["config.DISTRIBUTED.NUM_NODES=2"],
            "config.DISTRIBUTED.RUN_ID",
            "only works on one node",
        ),
    ],
)
def test_impossible_settings_are_config_errors(tmp_path, overrides, key, text):
    if "nccl" in overrides[0] and __import__("torch").cuda.is_available():
        pytest.skip("CUDA is available: nccl is a valid choice here")
    cfg = _cfg(*TWO, *overrides, f"config.CHECKPOINT.DIR={tmp_path}")
    with pytest.raises(ConfigError, match=text) as info:
        launch_distributed(cfg)
    assert info.value.key_path == key


def test_torchrun_mismatch_is_a_clear_error(tmp_path, monkeypatch):
    for key, value in {
        "RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match="torchrun started WORLD_SIZE=4") as info:
        launch_distributed(_cfg(*TWO, f"config.CHECKPOINT.DIR={tmp_path}"))
    assert "NUM_PROC_PER_NODE=4" in str(info.value)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_sigterm_to_the_launcher_checkpoints_stops_and_resumes(tmp_path):
    """SIGTERM reaches the launcher (a scheduler stopping the job): it is forwarded to the
    workers, which agree to stop (here at the end of the 2-step phase, where the ranks
    agree at once) and leave a checkpoint; a second launch resumes and finishes."""
    common = [
        *TWO,
        *SMALL,
        "config.DATA.TRAIN.DATA_LIMIT=8",
        "config.CHECKPOINT.AUTO_RESUME=True",
        f"config.CHECKPOINT.DIR={tmp_path}",
        f"config.IMPORTS=[{PLUGIN}]",
        "config.HOOKS.CUSTOM_HOOKS=[{name: signal_launcher_once, iteration: 1, signal_name: SIGTERM}]",
    ]
    with pytest.raises(TrainingPreempted):
        run_config(TINY, *common)
    saved = sorted(p.name for p in tmp_path.glob("model_*.torch"))
    assert saved and not list(tmp_path.glob("model_final*"))
    run_config(TINY, *common)
    log = (tmp_path / "log.txt").read_text()
    assert f"resuming from {tmp_path / saved[-1]}" in log
    assert (tmp_path / "model_final_checkpoint_phase1.torch").exists()


def test_unpicklable_hook_generator_with_spawn_is_a_clear_error(tmp_path):
    cfg = _cfg(*TWO, "config.MULTI_PROCESSING_METHOD=spawn", f"config.CHECKPOINT.DIR={tmp_path}")
    with pytest.raises(ConfigError, match="module-level function") as info:
        launch_distributed(cfg, hook_generator=lambda c: [])
    assert info.value.key_path == "config.MULTI_PROCESSING_METHOD"

"""Nothing a user trained is ever lost (#41 items 1 and 3): the data-loss trials.

Each trial trains a first run into a folder, hashes every file in it, tries a second run
that would have destroyed or mixed it, and checks every file of the first run is
byte-identical afterwards (or, when the user asked to train again, byte-identical in
``previous_runs/<time>/``):

- a second run into the folder of a live one (the lock);
- a second config into a finished folder (refused), and the same with
  ``CHECKPOINT.OVERWRITE_EXISTING`` (moved aside, then trained);
- an ``AUTO_RESUME`` of another model's checkpoint (refused before ``train_config.yaml``
  or ``log.txt`` changes), also when the checkpoint records no config (found when the
  model is built).

The runs are the tiny supervised ResNet of ``tests/_tiny_run.py``, in this process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests._tiny_run import SMALL, TINY
from vissl.errors import ResumeMismatchError, RunFolderError, RunFolderLockedError
from vissl.hooks import VisslHook, default_hook_generator
from vissl.launch.run_folder import PREVIOUS_RUNS
from vissl.launch.run_lock import LOCK_NAME
from vissl.utils.checkpoint import load_checkpoint
from vissl.utils.distributed_launcher import launch_distributed
from vissl.utils.hydra_config import hydra_compose_and_validate

FAST = [
    *SMALL,
    "config.OPTIMIZER.num_epochs=1",
    "config.TEST_MODEL=False",
    "config.DATA.TRAIN.DATA_LIMIT=16",
    "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=False",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _cfg(folder: Path, *overrides: str) -> Any:
    _, cfg = hydra_compose_and_validate(
        [f"config={TINY}", *FAST, f"config.CHECKPOINT.DIR={folder}", *overrides]
    )
    return cfg


def _run(folder: Path, *overrides: str, hooks: Any = None) -> Any:
    return launch_distributed(_cfg(folder, *overrides), hook_generator=hooks)


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (the lock file aside), by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name != LOCK_NAME
    }


class _Crash(VisslHook):
    """Fails at the start of the second phase, after the first one's checkpoint."""

    def on_phase_start(self, task: Any) -> None:
        if task.phase_idx == 1:
            raise RuntimeError("simulated crash")


def _crash_in_phase_1(cfg: Any) -> list[Any]:
    return [*default_hook_generator(cfg), _Crash()]


def test_a_second_config_into_a_finished_folder_changes_nothing(tmp_path):
    _run(tmp_path)
    first = snapshot(tmp_path)
    assert "model_final_checkpoint_phase0.torch" in first
    # the same config again: finished, nothing to do (VISSL)
    assert _run(tmp_path) is None
    assert snapshot(tmp_path) == first
    # another config: refused, naming the difference and the way out
    with pytest.raises(RunFolderError) as err:
        _run(tmp_path, "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 5]}]]")
    message = str(err.value)
    assert err.value.key_path == "config.CHECKPOINT.DIR"
    assert "holds a finished run of another config" in message
    assert "config.MODEL.HEAD.PARAMS" in message
    assert "config.CHECKPOINT.OVERWRITE_EXISTING=true" in message
    assert snapshot(tmp_path) == first
    assert not (tmp_path / LOCK_NAME).exists()


def test_overwrite_existing_moves_the_finished_run_aside_byte_for_byte(tmp_path):
    _run(tmp_path)
    first = snapshot(tmp_path)
    _run(
        tmp_path,
        "config.OPTIMIZER.param_schedulers.lr.value=0.01",
        "config.CHECKPOINT.OVERWRITE_EXISTING=True",
    )
    (aside,) = (tmp_path / PREVIOUS_RUNS).iterdir()
    assert snapshot(aside) == first
    # the new run has a folder of its own: its metrics hold its one phase only
    metrics = (tmp_path / "metrics.json").read_text().splitlines()
    assert len(metrics) == 1
    state = load_checkpoint(str(tmp_path / "model_final_checkpoint_phase0.torch"))
    assert "value: 0.01" in state["config"]


def test_a_resume_of_another_models_checkpoint_is_refused_before_the_folder_changes(tmp_path):
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(tmp_path, "config.OPTIMIZER.num_epochs=2", hooks=_crash_in_phase_1)
    first = snapshot(tmp_path)
    assert "model_phase0.torch" in first and "train_config.yaml" in first
    with pytest.raises(ResumeMismatchError) as err:
        _run(
            tmp_path,
            "config.OPTIMIZER.num_epochs=2",
            "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 5]}]]",
        )
    message = str(err.value)
    assert "holds a checkpoint of another model: model_phase0.torch" in message
    assert "config.CHECKPOINT.AUTO_RESUME=false" in message
    assert "config.CHECKPOINT.DIR=<new folder>" in message
    assert snapshot(tmp_path) == first


def test_a_checkpoint_without_its_config_is_checked_against_the_built_model(tmp_path):
    """A checkpoint that records no config (VISSL's, or a hand-made one) passes the
    launcher's check; the trainer refuses it when the weights do not fit, still before
    log.txt or train_config.yaml changes."""
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(tmp_path, "config.OPTIMIZER.num_epochs=2", hooks=_crash_in_phase_1)
    path = tmp_path / "model_phase0.torch"
    state = torch.load(path, weights_only=True)  # (not memory-mapped: it is rewritten)
    del state["config"]
    torch.save(state, path)
    first = snapshot(tmp_path)
    with pytest.raises(ResumeMismatchError, match="does not fit this model") as err:
        _run(
            tmp_path,
            "config.OPTIMIZER.num_epochs=2",
            "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 5]}]]",
        )
    assert "heads.0.clf.0.weight" in str(err.value) or "other shapes" in str(err.value)
    assert snapshot(tmp_path) == first


def test_auto_resume_false_moves_an_unfinished_run_aside(tmp_path):
    with pytest.raises(RuntimeError, match="simulated crash"):
        _run(tmp_path, "config.OPTIMIZER.num_epochs=2", hooks=_crash_in_phase_1)
    first = snapshot(tmp_path)
    _run(tmp_path, "config.CHECKPOINT.AUTO_RESUME=False")
    (aside,) = (tmp_path / PREVIOUS_RUNS).iterdir()
    assert snapshot(aside) == first
    assert (tmp_path / "model_final_checkpoint_phase0.torch").exists()


class _SecondRunDuringThisOne(VisslHook):
    """At the end of the first phase: snapshot the folder, start a second run into it,
    snapshot again."""

    def __init__(self, second_cfg: Any) -> None:
        self.second_cfg = second_cfg
        self.error: BaseException | None = None
        self.before: dict[str, str] = {}
        self.after: dict[str, str] = {}

    def on_phase_end(self, task: Any) -> None:
        if task.phase_idx != 0:
            return
        folder = Path(task.checkpoint_folder)
        self.before = snapshot(folder)
        try:
            launch_distributed(self.second_cfg)
        except BaseException as err:
            self.error = err
        self.after = snapshot(folder)


def test_a_live_run_refuses_a_second_run_into_its_folder(tmp_path):
    second = _SecondRunDuringThisOne(_cfg(tmp_path, "config.OPTIMIZER.num_epochs=1"))
    _run(
        tmp_path,
        "config.OPTIMIZER.num_epochs=2",
        hooks=lambda cfg: [*default_hook_generator(cfg), second],
    )
    assert isinstance(second.error, RunFolderLockedError), second.error
    assert "is in use by another run" in str(second.error)
    assert second.before and second.after == second.before
    # the first run then finished alone: two phases in its metrics, one final checkpoint
    assert len((tmp_path / "metrics.json").read_text().splitlines()) == 2
    assert sorted(p.name for p in tmp_path.glob("model_final*")) == [
        "model_final_checkpoint_phase1.torch"
    ]
    assert not (tmp_path / LOCK_NAME).exists()


# ---------------------------------------------------------------------- real processes
REPO = Path(__file__).resolve().parents[2]
TOOL = str(REPO / "tools" / "run_distributed_engines.py")


def _cli(folder: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        TOOL,
        f"config={TINY}",
        *FAST,
        f"config.CHECKPOINT.DIR={folder}",
        *overrides,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_two_command_lines_at_once_into_one_folder(tmp_path):
    """The issue's trial: two runs started at once into one folder. The first stands still
    after its first phase while the second starts: the second is refused (exit code 2,
    naming the first) and every file of the first is byte-identical; the first then
    trains alone to its end."""
    run, paused, resume = tmp_path / "run", tmp_path / "paused", tmp_path / "resume"
    hook = f"{{name: pause_after_first_phase, paused: '{paused}', resume: '{resume}'}}"
    first = subprocess.Popen(
        _cli(
            run,
            "config.OPTIMIZER.num_epochs=3",
            f"config.IMPORTS=[{REPO / 'tests/launch/plugins/pause_hooks.py'}]",
            f"config.HOOKS.CUSTOM_HOOKS=[{hook}]",
        ),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while not paused.exists() and time.time() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert paused.exists(), first.communicate()[0]
        before = snapshot(run)
        second = subprocess.run(
            _cli(run, "config.OPTIMIZER.num_epochs=1"),
            env=_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert snapshot(run) == before
    finally:
        resume.write_text("go\n")
    out, _ = first.communicate(timeout=600)
    assert second.returncode == 2, second.stderr
    assert f"is in use by another run: pid {first.pid} on" in second.stderr
    assert first.returncode == 0, out
    metrics = [json.loads(line) for line in (run / "metrics.json").read_text().splitlines()]
    assert [m["phase_idx"] for m in metrics] == [0, 1, 2]
    assert not (run / LOCK_NAME).exists()


@pytest.mark.slow
def test_two_nodes_share_one_folder_and_resume_from_rank_0s_choice(tmp_path):
    """Two launchers of one run (NUM_NODES=2) on a shared folder: only node 0 takes the
    lock; node 1 resumes from the checkpoint node 0 chose (it decides nothing itself)."""
    from vissl.utils.distributed import find_free_port

    def nodes(*overrides: str) -> None:
        port = find_free_port()
        common = [
            "config.DISTRIBUTED.NUM_NODES=2",
            "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
            f"config.DISTRIBUTED.RUN_ID=127.0.0.1:{port}",
            *overrides,
        ]
        procs = [
            subprocess.Popen(
                [*_cli(tmp_path, *common), f"node_id={node}"],
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for node in (0, 1)
        ]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs

    nodes()
    final = tmp_path / "model_final_checkpoint_phase0.torch"
    # an unfinished run of two epochs, stopped after its first: node 0 resumes it
    final.rename(tmp_path / "model_phase0.torch")
    (tmp_path / "checkpoint.torch").unlink()
    nodes("config.OPTIMIZER.num_epochs=2")
    assert (tmp_path / "model_final_checkpoint_phase1.torch").exists()
    log = (tmp_path / "log.txt").read_text()
    assert f"resuming from {tmp_path / 'model_phase0.torch'}" in log
    metrics = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [m["phase_idx"] for m in metrics] == [0, 1]
    assert not (tmp_path / LOCK_NAME).exists()


DIGITS = sorted(
    p.stem
    for p in (REPO / "configs" / "config" / "digits").glob("*.yaml")
    if p.stem != "clusterfit"
)


@pytest.mark.slow
def test_a_new_config_is_compared_as_its_checkpoints_record_it() -> None:
    """A checkpoint records the config with what the loss inferred when the task was built
    (DINO's output_dim from its head, crops from the transforms, queue lengths): a rerun
    of the same config is compared in that form, or it reads as another config."""
    from vissl.config.compare import config_differences
    from vissl.errors import ConfigError
    from vissl.launch.run_folder import as_recorded
    from vissl.losses import build_loss

    for name in ["quick_start", *(f"digits/{d}" for d in DIGITS)]:
        _, cfg = hydra_compose_and_validate([f"config={name}"])
        recorded = as_recorded(cfg)
        try:
            build_loss(cfg.LOSS, cfg)  # what the task does to its config
        except ConfigError:
            continue  # (a memory bank needs the data set's size: the task sets it)
        assert config_differences(cfg, recorded) == [], name


def test_a_rerun_of_a_finished_dino_run_has_nothing_to_do(tmp_path):
    """DINO's loss fills in its output_dim from the head when the task is built; a rerun of
    the same config is still the same run (it read as another config)."""
    _, cfg = hydra_compose_and_validate(
        [
            "config=digits/dino",
            "config.DATA.TRAIN.DATA_LIMIT=16",
            "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
            "config.OPTIMIZER.num_epochs=1",
            "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=False",
            f"config.CHECKPOINT.DIR={tmp_path}",
        ]
    )
    launch_distributed(cfg)
    first = snapshot(tmp_path)
    assert launch_distributed(cfg) is None  # finished: nothing to do
    assert snapshot(tmp_path) == first

"""Early stopping (HOOKS.EARLY_STOPPING): the decision, the stop it asks for, the checkpoint
it leaves, its state across a resume, the unknown-name error at start, and the stop agreed
by 2 processes started by the real launcher.

The in-process runs are the tiny supervised run of ``tests/_tiny_run.py`` with 3 epochs:
phases train 0, test 1, train 2, test 3, train 4, test 5 (4 steps per train phase). A
MIN_DELTA larger than any accuracy makes every monitored phase after the first one a
"no improvement", so the stop lands deterministically.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import pytest

from tests._cli import run_script
from tests._tiny_run import tiny_config, train_in_process
from vissl.errors import ConfigError
from vissl.hooks import VisslHook, default_hook_generator
from vissl.hooks.early_stopping_hook import EarlyStoppingHook
from vissl.hooks.metrics import flatten_metrics
from vissl.utils.checkpoint import has_final_checkpoint, list_checkpoints, load_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN = os.path.join(REPO, "tests", "hooks", "plugins", "end_state_hooks.py")
ACC = "test_accuracy_list_meter_top_1"
THREE_EPOCHS = "config.OPTIMIZER.num_epochs=3"


def _early(monitor: str = ACC, mode: str = "max", patience: int = 1, delta: float = 1000.0):
    return [
        "config.HOOKS.EARLY_STOPPING.ENABLE=True",
        f"config.HOOKS.EARLY_STOPPING.MONITOR={monitor}",
        f"config.HOOKS.EARLY_STOPPING.MODE={mode}",
        f"config.HOOKS.EARLY_STOPPING.PATIENCE={patience}",
        f"config.HOOKS.EARLY_STOPPING.MIN_DELTA={delta}",
    ]


class _Logs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _train(cfg: Any, extra: list[Any] | None = None, resume: str | None = None) -> Any:
    """Train with the default hooks; returns (task, hooks, log messages)."""
    hooks = [*default_hook_generator(cfg), *(extra or [])]
    logs = _Logs()
    vissl_logger = logging.getLogger("vissl")
    level = vissl_logger.level
    vissl_logger.addHandler(logs)
    vissl_logger.setLevel(logging.INFO)
    try:
        task = train_in_process(cfg, hooks, checkpoint_path=resume)
    finally:
        vissl_logger.removeHandler(logs)
        vissl_logger.setLevel(level)
    return task, hooks, logs.messages


def _hook(hooks: list[Any]) -> EarlyStoppingHook:
    (hook,) = [h for h in hooks if isinstance(h, EarlyStoppingHook)]
    return hook


# ---------------------------------------------------------------------- the keys
def test_off_by_default_and_built_from_the_config(tmp_path: Any) -> None:
    assert not any(
        isinstance(h, EarlyStoppingHook) for h in default_hook_generator(tiny_config(tmp_path))
    )
    hook = _hook(default_hook_generator(tiny_config(tmp_path, *_early(patience=2, delta=0.5))))
    assert (hook.monitor, hook.mode, hook.patience, hook.min_delta) == (ACC, "max", 2, 0.5)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"mode": "avg"}, "MODE"),
        ({"patience": 0}, "PATIENCE"),
        ({"min_delta": -1.0}, "MIN_DELTA"),
        ({"monitor": ""}, "MONITOR"),
    ],
)
def test_invalid_keys_name_their_key(kwargs: dict[str, Any], key: str) -> None:
    args: dict[str, Any] = {"monitor": "test_loss", **kwargs}
    with pytest.raises(ConfigError) as info:
        EarlyStoppingHook(**args)
    assert info.value.key_path == f"config.HOOKS.EARLY_STOPPING.{key}"
    assert f"config.HOOKS.EARLY_STOPPING.{key}" in str(info.value)


def test_improvement_needs_more_than_min_delta() -> None:
    hook = EarlyStoppingHook("test_loss", mode="min", min_delta=0.1)
    assert hook._improved(5.0)  # the first value is the first best
    hook.best = 5.0
    assert not hook._improved(4.95) and hook._improved(4.8)
    assert not hook._improved(float("nan"))
    up = EarlyStoppingHook(ACC, mode="max")
    up.best = 50.0
    assert up._improved(50.5) and not up._improved(50.0)


def test_flattened_names_are_those_of_metrics_json() -> None:
    record = {
        "iteration": 4,
        "phase_idx": 1,
        "train_phase_idx": 0,
        "test_loss": 2.5,
        "test_accuracy_list_meter": {"top_1": {"0": 50.0}, "top_5": {"0": 90.0}},
        "test_precision_at_k_list_meter": {"top_1": {"0": 1.0, "1": 2.0}},
    }
    assert flatten_metrics(record) == {
        "test_loss": 2.5,
        "test_accuracy_list_meter_top_1": 50.0,
        "test_accuracy_list_meter_top_5": 90.0,
        "test_precision_at_k_list_meter_top_1_0": 1.0,
        "test_precision_at_k_list_meter_top_1_1": 2.0,
    }


# ---------------------------------------------------------------------- unknown names
def test_an_unknown_name_fails_at_start_naming_the_logged_names(tmp_path: Any) -> None:
    cfg = tiny_config(tmp_path, *_early(monitor="test_acc_top1"))
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        _train(cfg)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("config.HOOKS.EARLY_STOPPING.MONITOR='test_acc_top1' is never")
    for name in (
        "test_loss",
        "test_accuracy_list_meter_top_1",
        "test_accuracy_list_meter_top_5",
        "train_loss",
        "train_accuracy_list_meter_top_1",
    ):
        assert name in message
    assert info.value.key_path == "config.HOOKS.EARLY_STOPPING.MONITOR"
    # at start: no phase ran
    assert not (tmp_path / "metrics.json").exists()
    assert time.monotonic() - start < 30


def test_a_test_name_without_test_phases_fails_at_start(tmp_path: Any) -> None:
    cfg = tiny_config(tmp_path, "config.TEST_MODEL=False", *_early(monitor="test_loss"))
    with pytest.raises(ConfigError, match=r"no test phases.*train_loss"):
        _train(cfg)


# ---------------------------------------------------------------------- stopping
def test_stops_after_the_test_phase_that_exhausts_patience(tmp_path: Any) -> None:
    cfg = tiny_config(tmp_path, THREE_EPOCHS, *_early())
    task, hooks, logs = _train(cfg)
    hook = _hook(hooks)
    # test phase 1 sets the best, test phase 3 does not beat it by 1000: stop there
    assert task.phase_idx == 3 and task.iteration == 8
    assert task.stop_training
    assert getattr(task, "end_reason", "early_stop") == "early_stop"
    assert hook.best_phase_idx == 1 and hook.bad_phases == 1 and hook.stopped_phase_idx == 3
    records = [json.loads(line) for line in open(tmp_path / "metrics.json")]
    assert [r["phase_idx"] for r in records] == [0, 1, 2, 3]
    assert hook.best == records[1]["test_accuracy_list_meter"]["top_1"]["0"]
    (why,) = [m for m in logs if "stopping training after phase 4/" in m]  # 1-based
    assert f"early stopping: {ACC} = " in why
    assert f"has not improved on the best {hook.best:.6g} (phase 2/" in why
    assert "MIN_DELTA=1000" in why and "PATIENCE=1" in why
    # the train phase before the stop was checkpointed (CHECKPOINT_FREQUENCY 1); the run
    # was cut short, so there is no final checkpoint
    names = [n for _, _, n in list_checkpoints(str(tmp_path))]
    assert names == ["model_phase0.torch", "model_phase2.torch"]
    assert not has_final_checkpoint(str(tmp_path))


def test_a_train_metric_is_checked_after_train_phases(tmp_path: Any) -> None:
    cfg = tiny_config(tmp_path, THREE_EPOCHS, *_early(monitor="train_loss", mode="min"))
    task, hooks, _ = _train(cfg)
    assert task.phase_idx == 2 and task.train  # stopped at the end of train phase 2
    assert _hook(hooks).best_phase_idx == 0
    names = [n for _, _, n in list_checkpoints(str(tmp_path))]
    assert names[-1] == "model_phase2.torch"


def test_no_stop_while_improving_and_none_on_the_last_phase(tmp_path: Any) -> None:
    # MODE min with a huge MIN_DELTA on an accuracy: never improves after phase 1, but
    # PATIENCE 2 runs out only at test phase 5, the last one: training just finishes.
    cfg = tiny_config(tmp_path, THREE_EPOCHS, *_early(patience=2))
    task, hooks, logs = _train(cfg)
    assert task.phase_idx == 5 and task.iteration == 12
    assert getattr(task, "end_reason", "finished") == "finished"
    assert _hook(hooks).bad_phases == 2
    assert any("this was the last phase anyway" in m for m in logs)
    assert has_final_checkpoint(str(tmp_path))


class _StateAtEnd(VisslHook):
    def on_end(self, task: Any) -> None:
        self.hook_state = _hook(task.hooks).state_dict()


def test_checkpoint_when_the_train_phase_was_not_saved_and_exact_resume(tmp_path: Any) -> None:
    """With CHECKPOINT_FREQUENCY 5 no train phase is saved before the stop: the hook
    writes ``model_phase3.torch`` after the test phase. Its state is in that checkpoint
    and a run resumed from it continues counting from there."""
    overrides = [THREE_EPOCHS, "config.CHECKPOINT.CHECKPOINT_FREQUENCY=5"]
    cfg = tiny_config(tmp_path, *overrides, *_early())
    task, hooks, logs = _train(cfg)
    assert task.phase_idx == 3
    names = [n for _, _, n in list_checkpoints(str(tmp_path))]
    assert names == ["model_phase3.torch"]
    assert any("early stopping: saved" in m for m in logs)
    saved = load_checkpoint(str(tmp_path / "model_phase3.torch"))
    assert saved["iteration"] == 8 and saved["phase_idx"] == 3
    state = saved["classy_state_dict"]["hooks"]["EarlyStoppingHook"]
    assert state == _hook(hooks).state_dict()
    assert state["bad_phases"] == 1 and state["best_phase_idx"] == 1

    # Resume with more patience: the counters continue (1 bad phase already), so the
    # last test phase makes 2, and training finishes.
    cfg2 = tiny_config(tmp_path, *overrides, *_early(patience=3))
    recorder = _StateAtEnd()
    task2, _, _ = _train(cfg2, [recorder], resume=str(tmp_path / "model_phase3.torch"))
    assert task2.phase_idx == 5 and task2.iteration == 12
    assert recorder.hook_state["bad_phases"] == 2
    assert recorder.hook_state["best"] == state["best"]
    assert recorder.hook_state["best_phase_idx"] == 1


def test_state_of_another_monitor_is_not_restored() -> None:
    saved = EarlyStoppingHook("test_loss", mode="min")
    saved.best, saved.bad_phases = 1.5, 2
    other = EarlyStoppingHook(ACC, mode="max")
    other.load_state_dict(saved.state_dict())
    assert other.best is None and other.bad_phases == 0
    same = EarlyStoppingHook("test_loss", mode="min", patience=5)
    same.load_state_dict(saved.state_dict())
    assert (same.best, same.bad_phases) == (1.5, 2)


# ---------------------------------------------------------------------- 2 processes
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_two_processes_stop_at_the_same_phase_through_the_launcher(tmp_path: Any) -> None:
    """Must-show: 2 gloo processes started by tools/run_distributed_engines.py stop after
    the same test phase, exit 0, keep their checkpoint and log why."""
    args = [
        sys.executable,
        os.path.join(REPO, "tools", "run_distributed_engines.py"),
        "config=test/cpu_test/tiny_supervised",
        "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
        "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 10]}]]",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.DATA.TRAIN.DATA_LIMIT=32",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
        "config.DATA.TEST.DATA_LIMIT=16",
        "config.DATA.TEST.BATCHSIZE_PER_REPLICA=4",
        THREE_EPOCHS,
        *_early(),
        f"config.CHECKPOINT.DIR={tmp_path}",
        f"config.IMPORTS=[{PLUGIN}]",
        "config.HOOKS.CUSTOM_HOOKS=[{name: record_end_state}]",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    proc = run_script(*args[1:], cwd=REPO, env=env, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ends = [json.loads((tmp_path / f"end_rank{r}.json").read_text()) for r in (0, 1)]
    for end in ends:
        assert end["phase_idx"] == 3 and end["iteration"] == 8, ends
        assert end.get("end_reason", "early_stop") in ("early_stop", ""), ends
        assert end["stop_training_reason"].startswith(f"early stopping: {ACC}")
    names = [n for _, _, n in list_checkpoints(str(tmp_path))]
    assert names == ["model_phase0.torch", "model_phase2.torch"]
    log = (tmp_path / "log.txt").read_text()
    assert "stopping training after phase 4/" in log
    assert "MIN_DELTA=1000" in log and "PATIENCE=1" in log
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["phase_idx"] == 3
    assert summary["end_reason"] == "early_stop"

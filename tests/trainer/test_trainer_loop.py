"""The trainer loop itself, on a small in-memory task (no launcher, no subprocess):
phase and iteration counting, the order of hook events, test phases, stops, preemption
and failures."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import pytest
import torch

from tests._tiny_run import (
    TEST_STEPS_PER_PHASE,
    TRAIN_STEPS_PER_PHASE,
    EventRecorder,
    tiny_config,
    train_in_process,
)
from vissl.errors import TrainingPreempted
from vissl.hooks import VisslHook
from vissl.hooks.checkpoint_hooks import CheckpointHook
from vissl.trainer.task import SelfSupervisionTask
from vissl.trainer.train_steps import TRAIN_STEP_REGISTRY, register_train_step
from vissl.utils.checkpoint import list_checkpoints, load_checkpoint

TRAIN, TEST = TRAIN_STEPS_PER_PHASE, TEST_STEPS_PER_PHASE


def _weights(task: SelfSupervisionTask) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in task.base_model.parameters()])


class PhaseWatcher(VisslHook):
    """Weights, model mode, meter counts and log steps, per phase."""

    def __init__(self) -> None:
        self.start_weights: list[torch.Tensor] = []
        self.end_weights: list[torch.Tensor] = []
        self.model_training: list[bool] = []
        self.meter_samples: list[int] = []
        self.num_updates: list[int] = []
        self.log_steps: list[tuple[int, int]] = []  # (phase, iteration or batch) logged

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        self.start_weights.append(_weights(task))
        self.model_training.append(task.model.training)

    def on_step(self, task: SelfSupervisionTask) -> None:
        if task.is_log_iteration:
            count = task.iteration if task.train else task.local_iteration_num
            self.log_steps.append((task.phase_idx, count))

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        self.end_weights.append(_weights(task))
        denom = task.meters[0].state_dict()["total_denom"]
        self.meter_samples.append(int(denom.sum().item()))
        self.num_updates.append(task.num_updates)


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run shared by the tests that only read what happened."""
    folder = tmp_path_factory.mktemp("two_epochs")
    recorder, watcher = EventRecorder(), PhaseWatcher()
    task = train_in_process(tiny_config(folder), [recorder, watcher])
    return {"task": task, "recorder": recorder, "watcher": watcher, "folder": folder}


# ---------------------------------------------------------------------- counting
def test_phases_alternate_train_and_test_as_configured(two_epochs: dict[str, Any]) -> None:
    task, recorder = two_epochs["task"], two_epochs["recorder"]
    assert task.phases == [{"train": True}, {"train": False}, {"train": True}, {"train": False}]
    starts = [(phase, train) for _, phase, train, _, _ in recorder.at("on_phase_start")]
    assert starts == [(0, True), (1, False), (2, True), (3, False)]
    assert task.phase_idx == 3 and task.train_phase_idx == 1 and task.num_train_phases == 2


def test_iteration_counts_optimizer_steps_and_local_counts_batches(
    two_epochs: dict[str, Any],
) -> None:
    task, recorder = two_epochs["task"], two_epochs["recorder"]
    steps = recorder.at("on_step")
    by_phase = {p: [(it, local) for _, ph, _, it, local in steps if ph == p] for p in range(4)}
    assert by_phase[0] == [(i, i) for i in range(1, TRAIN + 1)]
    # test batches count locally but do not advance the global iteration
    assert by_phase[1] == [(TRAIN, i) for i in range(1, TEST + 1)]
    assert by_phase[2] == [(TRAIN + i, i) for i in range(1, TRAIN + 1)]
    assert by_phase[3] == [(2 * TRAIN, i) for i in range(1, TEST + 1)]
    assert task.iteration == task.max_iteration == 2 * TRAIN
    assert task.where == 1.0
    # LOG_FREQUENCY 2: the first step and every 2nd, in steps (train) or batches (test)
    logged = two_epochs["watcher"].log_steps
    assert logged == [(0, 1), (0, 2), (0, 4), (1, 1), (1, 2), (2, 6), (2, 8), (3, 1), (3, 2)]
    assert task.num_updates == 2 * TRAIN * 8  # samples of the optimizer steps (batch 8)


def test_hook_events_fire_in_the_documented_order(two_epochs: dict[str, Any]) -> None:
    events = two_epochs["recorder"].events()
    train_step = ["on_forward", "on_loss_and_meter", "on_backward", "on_update", "on_step"]
    test_step = ["on_forward", "on_loss_and_meter", "on_step"]
    train_phase = ["on_phase_start", *train_step * TRAIN, "on_phase_end"]
    test_phase = ["on_phase_start", *test_step * TEST, "on_phase_end"]
    assert events == ["on_start", *(train_phase + test_phase) * 2, "on_end"]


def test_test_phases_evaluate_without_updating(two_epochs: dict[str, Any]) -> None:
    w = two_epochs["watcher"]
    assert w.model_training == [True, False, True, False]
    for phase in (1, 3):  # test phases: weights untouched
        assert torch.equal(w.start_weights[phase], w.end_weights[phase])
    for phase in (0, 2):
        assert not torch.equal(w.start_weights[phase], w.end_weights[phase])
    assert w.num_updates == [32, 32, 64, 64]  # samples seen by optimizer steps
    # meters are reset per phase and count that phase's samples only
    assert w.meter_samples == [32, 16, 32, 16]


def test_test_only_runs_a_single_test_phase(tmp_path: Any) -> None:
    recorder = EventRecorder()
    task = train_in_process(tiny_config(tmp_path, "config.TEST_ONLY=True"), [recorder])
    assert task.phases == [{"train": False}]
    assert task.optimizer is None and task.iteration == 0
    assert recorder.events() == [
        "on_start",
        "on_phase_start",
        *["on_forward", "on_loss_and_meter", "on_step"] * TEST,
        "on_phase_end",
        "on_end",
    ]


# ---------------------------------------------------------------------- stops
class StopAt(VisslHook):
    """Asks to stop after train iteration ``iteration``, or at the end of phase ``phase``."""

    def __init__(self, iteration: int = -1, phase: int = -1) -> None:
        self.iteration, self.phase = iteration, phase

    def on_step(self, task: SelfSupervisionTask) -> None:
        if task.train and task.iteration == self.iteration:
            task.stop_training = True
            task.stop_training_reason = "test asked"

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        if task.phase_idx == self.phase:
            task.stop_training = True


def _checkpoint_names(folder: Any) -> list[str]:
    return [name for _, _, name in list_checkpoints(str(folder))]


def test_a_stop_mid_phase_saves_an_iteration_checkpoint_that_resumes(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tiny_config(tmp_path)
    recorder = EventRecorder()
    with caplog.at_level(logging.INFO, logger="vissl.trainer.trainer_main"):
        task = train_in_process(cfg, [recorder, StopAt(iteration=3)])
    # one process reads the flag after every step: nothing runs after step 3
    assert task.iteration == 3 and task.phase_idx == 0
    assert [r[3] for r in recorder.at("on_step")] == [1, 2, 3]
    assert recorder.events()[-2:] == ["on_step", "on_end"]  # no on_phase_end
    assert _checkpoint_names(tmp_path) == ["model_iteration3.torch"]
    assert "training stopped at iteration 3 (phase 1/" in caplog.text  # phases 1-based
    assert "): test asked" in caplog.text

    resumed = EventRecorder()
    path = os.path.join(tmp_path, "model_iteration3.torch")
    task = train_in_process(cfg, [resumed], checkpoint_path=path)
    steps = resumed.at("on_step")
    assert steps[0][1:] == (0, True, 4, 4)  # phase 0 continues after its 3 batches
    assert task.iteration == 2 * TRAIN


def test_a_stop_at_phase_end_saves_the_phase_once(tmp_path: Any) -> None:
    recorder = EventRecorder()
    task = train_in_process(tiny_config(tmp_path / "bare"), [recorder, StopAt(phase=0)])
    assert task.phase_idx == 0 and task.iteration == TRAIN
    assert recorder.at("on_phase_start")[-1][1] == 0  # the test phase never starts
    assert _checkpoint_names(tmp_path / "bare") == ["model_phase0.torch"]
    state = load_checkpoint(str(tmp_path / "bare" / "model_phase0.torch"))
    assert state["iteration"] == TRAIN and state["classy_state_dict"]["phase_complete"]

    # The checkpoint hook already saved this phase: the stop does not save it again.
    hook = CheckpointHook(str(tmp_path / "hooked"))
    task = train_in_process(tiny_config(tmp_path / "hooked"), [hook, StopAt(phase=0)])
    assert _checkpoint_names(tmp_path / "hooked") == ["model_phase0.torch"]
    assert len(task.checkpoints_written) == 1


class SendSignal(VisslHook):
    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def on_step(self, task: SelfSupervisionTask) -> None:
        if task.train and task.iteration == self.iteration:
            os.kill(os.getpid(), signal.SIGUSR1)


def test_a_preemption_signal_checkpoints_and_raises_for_requeue(tmp_path: Any) -> None:
    before = signal.getsignal(signal.SIGUSR1)
    recorder = EventRecorder()
    with pytest.raises(TrainingPreempted, match="SIGUSR1 at iteration 2") as info:
        train_in_process(tiny_config(tmp_path), [recorder, SendSignal(2)])
    assert info.value.exit_code == 75
    assert _checkpoint_names(tmp_path) == ["model_iteration2.torch"]
    # a preemption is not a failure: on_end (with its end reason), not on_exception
    assert recorder.events()[-2:] == ["on_step", "on_end"]
    assert "on_exception" not in recorder.events()
    assert signal.getsignal(signal.SIGUSR1) is before  # handlers restored


# ---------------------------------------------------------------------- failures
class FailAt(VisslHook):
    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def on_step(self, task: SelfSupervisionTask) -> None:
        if task.iteration == self.iteration:
            raise RuntimeError(f"boom at {task.iteration}")

    def on_exception(self, task: SelfSupervisionTask) -> None:
        raise ValueError("a failing on_exception must not hide the original error")


def test_an_exception_runs_on_exception_then_propagates(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = EventRecorder()
    with pytest.raises(RuntimeError, match="boom at 2"):
        train_in_process(tiny_config(tmp_path), [recorder, FailAt(2)])
    events = recorder.events()
    assert events[-1] == "on_exception" and events.count("on_exception") == 1
    assert "on_end" not in events and "on_phase_end" not in events
    assert "a hook failed in on_exception" in caplog.text
    assert _checkpoint_names(tmp_path) == []


def test_a_train_step_returning_none_is_named(tmp_path: Any) -> None:
    @register_train_step("test_step_returning_none")
    def step_returning_none(task: SelfSupervisionTask) -> None:
        next(task.data_iterator)

    try:
        cfg = tiny_config(tmp_path, "config.TRAINER.TRAIN_STEP_NAME=test_step_returning_none")
        with pytest.raises(TypeError, match="'test_step_returning_none' returned None"):
            train_in_process(cfg)
    finally:
        TRAIN_STEP_REGISTRY.unregister("test_step_returning_none")

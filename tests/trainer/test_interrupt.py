"""Graceful interrupt and stop requests, on a small in-memory task (no launcher):
``task.request_stop``, ``task.end_reason`` before ``on_end`` / ``on_exception``, Ctrl-C
(SIGINT) once (checkpoint, then :class:`TrainingInterrupted`) and twice (abort at once),
the agreed stop kind, and the command line's exit codes and resume hint.

The same from a real terminal (tmux) and through the launcher: tests/integration/test_ctrl_c.py.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from tests._tiny_run import TRAIN_STEPS_PER_PHASE, EventRecorder, tiny_config, train_in_process
from vissl.errors import TrainingInterrupted, TrainingPreempted
from vissl.hooks import VisslHook
from vissl.launch import cli
from vissl.trainer.stopping import (
    EARLY_STOP,
    INTERRUPT,
    NO_STOP,
    PREEMPT,
    STOP,
    StopController,
    aborted_by_user,
)
from vissl.trainer.task import SelfSupervisionTask
from vissl.utils.checkpoint import list_checkpoints, load_checkpoint


class EndReason(VisslHook):
    """Records ``task.end_reason`` as ``on_end`` / ``on_exception`` see it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_end(self, task: SelfSupervisionTask) -> None:
        self.seen.append(("on_end", task.end_reason))

    def on_exception(self, task: SelfSupervisionTask) -> None:
        self.seen.append(("on_exception", task.end_reason))


class RequestStop(VisslHook):
    def __init__(self, iteration: int, kind: str = "requested") -> None:
        self.iteration = iteration
        self.kind = kind

    def on_step(self, task: SelfSupervisionTask) -> None:
        if task.train and task.iteration == self.iteration:
            task.request_stop("why", kind=self.kind)


class CtrlC(VisslHook):
    """Sends this process ``times`` SIGINTs after a train iteration (a user's Ctrl-C)."""

    def __init__(self, iteration: int, times: int = 1) -> None:
        self.iteration = iteration
        self.times = times

    def on_step(self, task: SelfSupervisionTask) -> None:
        if task.train and task.iteration == self.iteration:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGINT)  # handled before os.kill returns


def _names(folder: Any) -> list[str]:
    return [name for _, _, name in list_checkpoints(str(folder))]


@pytest.mark.parametrize("kind", ["requested", "early_stop"])
def test_request_stop_mid_phase_checkpoints_and_ends_with_its_kind(
    tmp_path: Any, kind: str
) -> None:
    recorder, reason = EventRecorder(), EndReason()
    task = train_in_process(tiny_config(tmp_path), [recorder, reason, RequestStop(2, kind)])
    assert task.iteration == 2 and task.phase_idx == 0
    assert task.stop_training and task.stop_training_reason == "why"
    assert task.end_reason == kind and reason.seen == [("on_end", kind)]
    assert _names(tmp_path) == ["model_iteration2.torch"]
    state = load_checkpoint(str(tmp_path / "model_iteration2.torch"))
    assert state["classy_state_dict"]["phase_complete"] is False
    assert "on_phase_end" not in recorder.events() and recorder.events()[-1] == "on_end"


def test_request_stop_rejects_an_unknown_kind(tmp_path: Any) -> None:
    task = SelfSupervisionTask.__new__(SelfSupervisionTask)
    task.stop_training, task.stop_training_reason, task.stop_kind = False, "", ""
    with pytest.raises(ValueError, match="unknown kind 'later'.*'early_stop'"):
        task.request_stop("why", kind="later")
    assert not task.stop_training
    task.request_stop("patience", kind="early_stop")
    task.request_stop("Ctrl-C", kind="interrupted")  # more urgent: wins the kind
    task.request_stop("again", kind="requested")  # less urgent: changes nothing
    assert (task.stop_kind, task.stop_training_reason) == ("interrupted", "patience")


def test_a_finished_run_ends_with_finished_and_a_failed_one_with_error(tmp_path: Any) -> None:
    reason = EndReason()
    assert train_in_process(tiny_config(tmp_path / "ok"), [reason]).end_reason == "finished"
    assert reason.seen == [("on_end", "finished")]

    class Fail(VisslHook):
        def on_step(self, task: SelfSupervisionTask) -> None:
            raise RuntimeError("boom")

    reason = EndReason()
    with pytest.raises(RuntimeError, match="boom"):
        train_in_process(tiny_config(tmp_path / "fail"), [reason, Fail()])
    assert reason.seen == [("on_exception", "error")]


def test_request_stop_preempted_runs_on_end_then_raises_for_requeue(tmp_path: Any) -> None:
    reason = EndReason()
    with pytest.raises(TrainingPreempted) as info:
        train_in_process(tiny_config(tmp_path), [reason, RequestStop(3, "preempted")])
    assert info.value.exit_code == 75
    assert reason.seen == [("on_end", "preempted")]
    assert _names(tmp_path) == ["model_iteration3.torch"]


def test_ctrl_c_finishes_the_step_checkpoints_and_raises_interrupted(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    before = signal.getsignal(signal.SIGINT)
    recorder, reason = EventRecorder(), EndReason()
    cfg = tiny_config(tmp_path, "config.CHECKPOINT.AUTO_RESUME=False")
    with pytest.raises(TrainingInterrupted, match="at iteration 2: Ctrl-C") as info:
        train_in_process(cfg, [recorder, reason, CtrlC(2)])
    assert info.value.exit_code == 130 and info.value.auto_resume is False
    assert _names(tmp_path) == ["model_iteration2.torch"]
    assert reason.seen == [("on_end", "interrupted")]
    # the step that was running finished: no other step started after the signal
    assert recorder.at("on_step")[-1][3] == 2 and recorder.events()[-1] == "on_end"
    assert signal.getsignal(signal.SIGINT) is before  # handler restored
    assert "Ctrl-C (SIGINT) received: training stops after the current step" in caplog.text
    stopped = "Ctrl-C (SIGINT): stopped after iteration 2 (phase 1/"  # 1-based
    assert stopped in caplog.text
    assert (
        f"; saved {tmp_path / 'model_iteration2.torch'}; exiting with code 130: run the same "
        "command with config.CHECKPOINT.AUTO_RESUME=true to resume."
    ) in caplog.text

    # the checkpoint resumes: the rest of the run completes from iteration 2
    task = train_in_process(
        tiny_config(tmp_path), checkpoint_path=str(tmp_path / "model_iteration2.torch")
    )
    assert task.iteration == 2 * TRAIN_STEPS_PER_PHASE and task.end_reason == "finished"


def test_a_second_ctrl_c_aborts_at_once_without_a_checkpoint(tmp_path: Any) -> None:
    before = signal.getsignal(signal.SIGINT)
    recorder, reason = EventRecorder(), EndReason()
    with pytest.raises(KeyboardInterrupt):
        train_in_process(tiny_config(tmp_path), [recorder, reason, CtrlC(2, times=2)])
    assert aborted_by_user()
    assert _names(tmp_path) == []
    assert reason.seen == [("on_exception", "interrupted")]
    assert "on_end" not in recorder.events()
    assert signal.getsignal(signal.SIGINT) is before


def test_an_ignored_sigint_stays_ignored(tmp_path: Any) -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        task = train_in_process(tiny_config(tmp_path), [CtrlC(2)])
        assert task.end_reason == "finished"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------------- agreement
class _Task:
    stop_training = False
    stop_training_reason = ""
    stop_kind = ""


def test_the_most_urgent_kind_wins_and_is_recorded_on_the_task() -> None:
    stopper = StopController()
    task = _Task()
    assert stopper.after_step(task) == NO_STOP and task.stop_kind == ""
    task.stop_training = True  # a hook that only sets the flag: a plain request
    assert stopper.after_step(task) == STOP and task.stop_kind == "requested"
    task.stop_kind = "early_stop"
    assert stopper.after_step(task) == EARLY_STOP
    stopper.interrupts = 1  # Ctrl-C
    assert stopper.after_step(task) == INTERRUPT and task.stop_kind == "interrupted"
    stopper.preempted = True
    assert stopper.at_phase_end(task) == PREEMPT and task.stop_kind == "preempted"
    assert task.stop_training_reason == ""  # the hook's (empty) reason is kept

    other = _Task()
    stopper = StopController()
    stopper.interrupts = 1
    assert stopper.after_step(other) == INTERRUPT
    assert other.stop_training and other.stop_training_reason == "Ctrl-C (SIGINT)"


# ---------------------------------------------------------------------- command line
def test_resume_command_is_the_same_command_with_auto_resume_on(monkeypatch: Any) -> None:
    monkeypatch.setattr("sys.argv", ["tools/run_distributed_engines.py"])
    argv = ["config=quick_start", "config.CHECKPOINT.DIR=/tmp/my run"]
    command = cli.resume_command(argv, auto_resume=True)
    assert command.endswith(
        "tools/run_distributed_engines.py config=quick_start 'config.CHECKPOINT.DIR=/tmp/my run'"
    )
    off = [*argv, "config.CHECKPOINT.AUTO_RESUME=False"]
    assert cli.resume_command(off, auto_resume=False).endswith(
        "'config.CHECKPOINT.DIR=/tmp/my run' config.CHECKPOINT.AUTO_RESUME=true"
    )


def test_cli_exits_130_with_the_resume_hint_or_the_abort_note(
    monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["tools/run_distributed_engines.py", "config=quick_start"])

    def interrupted(overrides: list[str]) -> None:
        raise TrainingInterrupted("training interrupted at iteration 7: Ctrl-C (SIGINT)", False)

    monkeypatch.setattr(cli, "hydra_main", interrupted)
    assert cli.main() == TrainingInterrupted.exit_code == 130
    err = capsys.readouterr().err
    assert "vissl: training interrupted at iteration 7: Ctrl-C (SIGINT).\nTo resume, run:\n" in err
    assert err.rstrip().endswith(
        "tools/run_distributed_engines.py config=quick_start config.CHECKPOINT.AUTO_RESUME=true"
    )

    def aborted(overrides: list[str]) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "hydra_main", aborted)
    assert cli.main() == 130
    err = capsys.readouterr().err
    assert "aborted by Ctrl-C" in err and "Traceback" not in err

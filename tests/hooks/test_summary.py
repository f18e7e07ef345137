"""The end-of-training summary (HOOKS.SUMMARY): printed and written to ``summary.json``
for a finished, an early-stopped, a failed and an interrupted run; its totals survive a
resume.

The runs are the tiny supervised run of ``tests/_tiny_run.py``: 2 epochs of 4 steps (batch
8), each followed by a test phase of 2 batches; phases train 0, test 1, train 2, test 3.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

import vissl.errors
from tests._tiny_run import tiny_config, train_in_process
from vissl.hooks import VisslHook, default_hook_generator
from vissl.hooks.summary_hook import SUMMARY_FILE, TrainingSummaryHook

TrainingInterrupted = getattr(vissl.errors, "TrainingInterrupted", None)


class _Logs(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _train(cfg: Any, *extra: Any, resume: str | None = None) -> tuple[Any, list[str]]:
    """Train with the default hooks plus ``extra``; returns (task or error, log messages)."""
    logs = _Logs()
    vissl_logger = logging.getLogger("vissl")
    level = vissl_logger.level
    vissl_logger.addHandler(logs)
    vissl_logger.setLevel(logging.INFO)
    try:
        task = train_in_process(cfg, [*default_hook_generator(cfg), *extra], resume)
    finally:
        vissl_logger.removeHandler(logs)
        vissl_logger.setLevel(level)
    return task, logs.messages


def _summary(folder: Any) -> dict[str, Any]:
    return json.loads((folder / SUMMARY_FILE).read_text())  # type: ignore[no-any-return]


def _records(folder: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in open(folder / "metrics.json")]


class RaiseAt(VisslHook):
    def __init__(self, iteration: int, error: BaseException) -> None:
        self.iteration, self.error = iteration, error

    def on_step(self, task: Any) -> None:
        if task.train and task.iteration == self.iteration:
            raise self.error


class RequestStopAt(VisslHook):
    def __init__(self, iteration: int, kind: str) -> None:
        self.iteration, self.kind = iteration, kind

    def on_step(self, task: Any) -> None:
        if task.train and task.iteration == self.iteration:
            task.request_stop(f"test asked for a stop ({self.kind})", kind=self.kind)


# ---------------------------------------------------------------------- finished
def test_on_by_default_and_off_by_config(tmp_path: Any) -> None:
    hooks = default_hook_generator(tiny_config(tmp_path))
    assert sum(isinstance(h, TrainingSummaryHook) for h in hooks) == 1
    off = default_hook_generator(tiny_config(tmp_path, "config.HOOKS.SUMMARY.ENABLE=False"))
    assert not any(isinstance(h, TrainingSummaryHook) for h in off)


def test_a_finished_run_prints_and_writes_its_summary(tmp_path: Any) -> None:
    cfg = tiny_config(tmp_path, "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=True")
    _, logs = _train(cfg)
    summary = _summary(tmp_path)
    records = _records(tmp_path)
    assert summary["end_reason"] == "finished"
    assert summary["stop_reason"] is None and summary["error"] is None
    assert summary["iteration"] == summary["max_iteration"] == 8
    assert (summary["phase_idx"], summary["num_phases"]) == (3, 4)
    assert summary["world_size"] == 1 and summary["wall_time_s"] > 0

    train, test = summary["train"], summary["test"]
    assert (train["phases"], test["phases"]) == (2, 2)
    assert (train["samples"], test["samples"]) == (64, 32)  # 2 x 32 and 2 x 16 samples
    assert train["images_per_s"] > 0 and test["images_per_s"] > 0
    # final: the last record of each kind, under the flattened names
    assert train["final"]["phase_idx"] == 2 and test["final"]["phase_idx"] == 3
    last_test = records[3]
    assert test["final"]["metrics"] == {
        "test_loss": pytest.approx(last_test["test_loss"]),
        "test_accuracy_list_meter_top_1": last_test["test_accuracy_list_meter"]["top_1"]["0"],
        "test_accuracy_list_meter_top_5": last_test["test_accuracy_list_meter"]["top_5"]["0"],
    }
    # best: lowest loss, highest accuracy, with the phase it came from
    losses = {r["phase_idx"]: r["test_loss"] for r in records if "test_loss" in r}
    best_loss = test["best"]["test_loss"]
    assert best_loss["mode"] == "min"
    assert best_loss["value"] == pytest.approx(min(losses.values()))
    assert losses[best_loss["phase_idx"]] == pytest.approx(best_loss["value"])
    top1 = {r["phase_idx"]: r["train_accuracy_list_meter"]["top_1"]["0"] for r in records[::2]}
    best_top1 = train["best"]["train_accuracy_list_meter_top_1"]
    assert best_top1["mode"] == "max" and best_top1["value"] == max(top1.values())
    assert top1[best_top1["phase_idx"]] == best_top1["value"]
    # perf stats (PERF_STATS on): mean time per call of the step sections, over the run
    assert train["perf_stats"]["forward"]["count"] == 8
    assert test["perf_stats"]["forward"]["count"] == 4
    assert 0 < train["perf_stats"]["forward"]["host_ms"] < summary["wall_time_s"] * 1000 / 8
    assert [c.rsplit("/", 1)[1] for c in summary["checkpoints"]] == [
        "model_phase0.torch",
        "model_final_checkpoint_phase2.torch",
    ]
    assert summary["hparams"]["OPTIMIZER.name"] == "sgd"
    # printed: a head line and one block per kind
    (printed,) = [m for m in logs if m.startswith("training summary: ended finished")]
    assert "iteration 8/8" in printed
    assert "  test: 2 phase(s)" in printed and "images/s" in printed
    assert "test_accuracy_list_meter_top_1" in printed
    assert "perf train_step_total" in printed
    assert "model_final_checkpoint_phase2.torch" in printed
    assert any(m.startswith("training summary written to") for m in logs)


def test_an_early_stopped_run_says_why(tmp_path: Any) -> None:
    cfg = tiny_config(
        tmp_path,
        "config.OPTIMIZER.num_epochs=3",
        "config.HOOKS.EARLY_STOPPING.ENABLE=True",
        "config.HOOKS.EARLY_STOPPING.MONITOR=test_loss",
        "config.HOOKS.EARLY_STOPPING.PATIENCE=1",
        "config.HOOKS.EARLY_STOPPING.MIN_DELTA=1e9",
    )
    _, logs = _train(cfg)
    summary = _summary(tmp_path)
    assert summary["end_reason"] == "early_stop"
    assert summary["stop_reason"].startswith("early stopping: test_loss = ")
    assert (summary["phase_idx"], summary["iteration"], summary["max_iteration"]) == (3, 8, 12)
    assert summary["test"]["phases"] == 2 and summary["test"]["final"]["phase_idx"] == 3
    assert any(m.startswith("training summary: ended early_stop (early stopping:") for m in logs)


# ---------------------------------------------------------------------- other endings
def test_a_failed_run_writes_the_error(tmp_path: Any) -> None:
    cfg = tiny_config(tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        _train(cfg, RaiseAt(6, RuntimeError("boom")))
    summary = _summary(tmp_path)
    assert summary["end_reason"] == "error"
    assert summary["error"] == "RuntimeError: boom"
    assert summary["iteration"] == 6 and summary["phase_idx"] == 2
    assert summary["train"]["phases"] == 1 and summary["test"]["phases"] == 1


def test_a_keyboard_interrupt_is_interrupted(tmp_path: Any) -> None:
    """A KeyboardInterrupt that reaches the trainer (e.g. a second Ctrl-C)."""
    with pytest.raises(KeyboardInterrupt):
        _train(tiny_config(tmp_path), RaiseAt(3, KeyboardInterrupt()))
    summary = _summary(tmp_path)
    assert summary["end_reason"] == "interrupted"
    assert summary["error"].startswith("KeyboardInterrupt")
    assert "train" not in summary  # no phase ended


@pytest.mark.skipif(TrainingInterrupted is None, reason="no graceful Ctrl-C stop yet")
def test_an_interrupted_stop_is_summarised_before_the_exit(tmp_path: Any) -> None:
    """A first Ctrl-C asks for a stop of kind "interrupted": on_end runs, then the
    trainer raises TrainingInterrupted (exit code 130)."""
    assert TrainingInterrupted is not None
    with pytest.raises(TrainingInterrupted):
        _train(tiny_config(tmp_path), RequestStopAt(3, "interrupted"))
    summary = _summary(tmp_path)
    assert summary["end_reason"] == "interrupted"
    assert summary["stop_reason"] == "test asked for a stop (interrupted)"
    assert summary["error"] is None
    assert summary["iteration"] == 3
    assert summary["checkpoints"][-1].endswith("model_iteration3.torch")


# ---------------------------------------------------------------------- resume
def test_totals_and_bests_cover_the_resumed_run(tmp_path: Any) -> None:
    first = tmp_path / "first"
    _train(tiny_config(first))
    whole = _summary(first)
    resumed = tmp_path / "resumed"
    _train(tiny_config(resumed))  # the same run, then again from its phase-0 checkpoint
    (resumed / SUMMARY_FILE).unlink()
    _train(tiny_config(resumed), resume=str(resumed / "model_phase0.torch"))
    again = _summary(resumed)
    assert again["train"]["phases"] == whole["train"]["phases"] == 2
    assert again["test"]["phases"] == whole["test"]["phases"] == 2
    assert again["train"]["samples"] == whole["train"]["samples"]
    for kind in ("train", "test"):  # resume is exact: the same values, bit for bit
        assert again[kind]["best"] == whole[kind]["best"]
        assert again[kind]["final"] == whole[kind]["final"]


def test_state_round_trip() -> None:
    hook = TrainingSummaryHook("unused")
    hook.kinds = {
        "train": {
            "phases": 1,
            "time_s": 0.5,
            "samples": 8,
            "final": None,
            "best": {},
            "perf": {"forward": [0.1, 2.0, 0.0, 0.0]},
        }
    }
    other = TrainingSummaryHook("unused")
    other.load_state_dict(hook.state_dict())
    assert other.kinds == hook.kinds

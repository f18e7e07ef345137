"""Each default hook on a small in-memory task (no launcher): what it writes or logs, and
when. The shared run is 2 epochs of 4 steps, each followed by a 2-batch test phase
(phases train, test, train, test), with LOG_FREQUENCY 2.

The monitoring and profiling hooks have their own files (test_monitoring_hooks.py,
test_profiling_hook.py).
"""

from __future__ import annotations

import json
import logging
import math
import os
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from tests._tiny_run import (
    TEST_STEPS_PER_PHASE,
    TRAIN_STEPS_PER_PHASE,
    tiny_config,
)
from tests._tiny_run import train_in_process as train
from vissl.hooks import HookDispatcher, Priority, VisslHook, default_hook_generator
from vissl.hooks.checkpoint_hooks import CheckpointHook, LogMetricsHook
from vissl.hooks.log_hooks import LogLossLrEtaHook, LogPerfTimeMetricsHook
from vissl.hooks.state_update_hooks import CheckNanLossHook, GradClipHook
from vissl.hooks.summary_hook import TrainingSummaryHook
from vissl.hooks.tensorboard_hook import SSLTensorboardHook
from vissl.trainer.precision import Precision
from vissl.trainer.task import SelfSupervisionTask
from vissl.utils.checkpoint import list_checkpoints

TRAIN, TEST = TRAIN_STEPS_PER_PHASE, TEST_STEPS_PER_PHASE
LOG_ITERATIONS = [1, 2, 4, 6, 8]  # the first, then every LOG_FREQUENCY (2) of 8
HAS_TENSORBOARD = True
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:  # pragma: no cover - tensorboard is optional
    HAS_TENSORBOARD = False

RUN_OVERRIDES = [
    "config.HOOKS.PROGRESS_BAR=True",
    "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=True",
    "config.HOOKS.PERF_STATS.PERF_STAT_FREQUENCY=2",
    "config.HOOKS.PERF_STATS.ROLLING_BTIME_FREQ=4",
    f"config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD={HAS_TENSORBOARD}",
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
]


class FakeBar:
    """Stands in for tqdm: records what the progress bar is told."""

    instances: list[FakeBar] = []

    def __init__(self, total: int, desc: str, **kwargs: Any) -> None:
        self.total, self.desc, self.n, self.closed = total, desc, 0, False
        self.postfix: dict[str, Any] = {}
        FakeBar.instances.append(self)

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, refresh: bool = True, **kwargs: Any) -> None:
        self.postfix = kwargs

    def close(self) -> None:
        self.closed = True


class StepRecorder(VisslHook):
    """The loss and learning rate of every train step, read after all other hooks."""

    priority = Priority.LOWEST + 1

    def __init__(self) -> None:
        self.loss: dict[int, float] = {}
        self.lr: dict[int, float] = {}
        self.phase_losses: dict[int, list[float]] = {}

    def on_step(self, task: SelfSupervisionTask) -> None:
        loss = float(task.last_batch.loss)
        self.phase_losses.setdefault(task.phase_idx, []).append(loss)
        if task.train:
            self.loss[task.iteration] = loss
            self.lr[task.iteration] = task.optimizer.param_groups[0]["lr"]


class LogCollector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def matching(self, text: str) -> list[str]:
        return [m for m in self.messages if text in m]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One training run with the default hooks, shared by the tests that read its output."""
    folder = tmp_path_factory.mktemp("default_hooks")
    cfg = tiny_config(folder, *RUN_OVERRIDES)
    hooks = default_hook_generator(cfg)
    recorder = StepRecorder()
    logs = LogCollector()
    vissl_logger = logging.getLogger("vissl")
    level = vissl_logger.level
    vissl_logger.addHandler(logs)
    vissl_logger.setLevel(logging.INFO)
    FakeBar.instances = []
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("tqdm.auto.tqdm", FakeBar)
            # a terminal: the live (tqdm) bar; elsewhere one line per phase (test_progress_bar.py)
            mp.setattr("vissl.hooks.log_hooks._isatty", lambda stream: True)
            task = train(cfg, [*hooks, recorder])
    finally:
        vissl_logger.removeHandler(logs)
        vissl_logger.setLevel(level)
    by_type = {type(h): h for h in hooks}
    return SimpleNamespace(
        task=task,
        folder=folder,
        hooks=by_type,
        recorder=recorder,
        logs=logs,
        bars=list(FakeBar.instances),
    )


def _jsonl(path: Any) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ---------------------------------------------------------------------- the hook list
def test_the_default_hooks_follow_the_config(tmp_path: Any) -> None:
    plain = default_hook_generator(tiny_config(tmp_path))
    assert [type(h) for h in plain] == [
        CheckNanLossHook,
        LogLossLrEtaHook,
        LogMetricsHook,
        TrainingSummaryHook,
        CheckpointHook,
    ]
    cfg = tiny_config(
        tmp_path,
        "config.HOOKS.CHECK_NAN=False",
        "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=True",
        "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=True",
        "config.MODEL.GRAD_CLIP.USE_GRAD_CLIP=True",
    )
    hooks = default_hook_generator(cfg)
    types = [type(h) for h in hooks]
    assert CheckNanLossHook not in types
    assert {LogPerfTimeMetricsHook, SSLTensorboardHook, GradClipHook} <= set(types)
    tb = next(h for h in hooks if isinstance(h, SSLTensorboardHook))
    assert tb.log_dir == os.path.join(str(tmp_path), "tensorboard")


def test_call_order_puts_the_nan_check_first_and_checkpoints_last(tmp_path: Any) -> None:
    cfg = tiny_config(
        tmp_path,
        "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=True",
        "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=True",
    )
    order = [type(h) for h in HookDispatcher(default_hook_generator(cfg)).hooks]
    assert order[0] is CheckNanLossHook and order[1] is LogPerfTimeMetricsHook
    assert order[-1] is CheckpointHook
    # metrics.json is written before the checkpoint of the same phase end
    assert order.index(LogMetricsHook) < order.index(CheckpointHook)


# ---------------------------------------------------------------------- logging
def test_stdout_json_has_one_line_per_train_log_iteration(run: SimpleNamespace) -> None:
    lines = _jsonl(run.folder / "stdout.json")
    assert [r["iteration"] for r in lines] == LOG_ITERATIONS  # test phases write none
    for r in lines:
        it = r["iteration"]
        assert r["loss"] == pytest.approx(run.recorder.loss[it], rel=1e-6)
        assert r["lr"] == pytest.approx(run.recorder.lr[it])
        assert r["train"] is True and r["btime(ms)"] > 0
        assert r["ep"] == r["train_phase_idx"] == (0 if it <= TRAIN else 1)
    assert lines[-1]["eta"] == "0:00:00"


def test_log_lines_at_log_iterations_and_phase_ends(run: SimpleNamespace) -> None:
    iters = run.logs.matching("] iter: ")
    assert [m.split("iter: ")[1].split(";")[0] for m in iters] == [
        f"{i}/{2 * TRAIN}" for i in LOG_ITERATIONS
    ]
    # phases and epochs are 1-based on the console (stdout.json keeps VISSL's 0-based ep)
    assert iters[0].startswith("[ep: 1/2]") and iters[-1].startswith("[ep: 2/2]")
    done = run.logs.matching(" done in ")
    assert [m.split(" done")[0] for m in done] == [
        "phase 1/4 (train)",
        "phase 2/4 (test)",
        "phase 3/4 (train)",
        "phase 4/4 (test)",
    ]
    # ROLLING_BTIME_FREQ 4: iterations 4 and 8 of the train phases, never in test phases
    assert len(run.logs.matching("rolling average batch time")) == 2


def test_progress_bar_per_phase(run: SimpleNamespace) -> None:
    assert [(b.desc, b.total, b.n, b.closed) for b in run.bars] == [
        ("train ep 1/2", TRAIN, TRAIN, True),
        ("test after ep 1", TEST, TEST, True),
        ("train ep 2/2", TRAIN, TRAIN, True),
        ("test after ep 2", TEST, TEST, True),
    ]
    assert set(run.bars[0].postfix) == {"loss", "lr"}


def test_no_progress_bar_when_off(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeBar.instances = []
    monkeypatch.setattr("tqdm.auto.tqdm", FakeBar)
    hook = LogLossLrEtaHook(str(tmp_path), progress_bar=False)
    task = SimpleNamespace(train=True, train_phase_idx=0, num_train_phases=1)
    hook.on_phase_start(task)  # type: ignore[arg-type]
    assert FakeBar.instances == []


def test_perf_stats_every_n_iterations_and_per_phase(run: SimpleNamespace) -> None:
    reports = run.logs.matching("perf stats (mean per call)")
    # every 2 train iterations (2, 4, 6, 8), and once at each phase end (4, 4, 8, 8): the
    # test phases, which do not advance the iteration, report at their end only
    assert [m.split(",")[0] for m in reports] == [
        f"iteration {i}" for i in (2, 4, 4, 4, 6, 8, 8, 8)
    ]
    hook = run.hooks[LogPerfTimeMetricsHook]
    last = hook.last_summary  # the last test phase: no backward, no optimizer step
    assert int(last["forward"]["count"]) == TEST
    assert "backward" not in last and "optimizer_step" not in last
    assert run.task.perf_stats is None  # timers off again after the phase


def test_the_perf_table_prints_once_per_run_by_default(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """#41 item 10: the phase-end perf table went to the console after every epoch. By
    default it goes to log.txt (and TensorBoard) only; the console gets the breakdown once,
    in the end-of-training summary. PRINT_EVERY_PHASE prints it every phase again."""
    from types import SimpleNamespace as Task

    from vissl.utils.logger import setup_logging, shutdown_logging
    from vissl.utils.perf_stats import PerfStats

    cfg = tiny_config(
        tmp_path, "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=True", "config.TEST_MODEL=False"
    )
    table = "perf stats (mean per call)"
    setup_logging(str(tmp_path), 0)
    try:
        train(cfg, default_hook_generator(cfg))
        out, log = capsys.readouterr().out, (tmp_path / "log.txt").read_text()
        assert out.count(table) == 0 and log.count(table) == 2  # 2 train phases
        assert out.count("perf forward: host") == 1  # the run's breakdown, in the summary
        # asked for: every phase's table on the console as well
        every = tiny_config(
            tmp_path,
            "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=True",
            "config.HOOKS.PERF_STATS.PRINT_EVERY_PHASE=True",
        )
        (hook,) = [
            h for h in default_hook_generator(every) if isinstance(h, LogPerfTimeMetricsHook)
        ]
        assert hook.print_every_phase
        task = Task(device=torch.device("cpu"), iteration=4, perf_stats=PerfStats())
        with task.perf_stats.timer("forward"):
            pass
        hook.on_phase_end(task)  # type: ignore[arg-type]
        assert capsys.readouterr().out.count(table) == 1
    finally:
        shutdown_logging()


def test_perf_stats_timers_cover_the_train_step_sections(tmp_path: Any) -> None:
    hook = LogPerfTimeMetricsHook(perf_stat_frequency=-1)
    cfg = tiny_config(tmp_path, "config.TEST_MODEL=False", "config.OPTIMIZER.num_epochs=1")
    train(cfg, [hook])
    sections = hook.last_summary
    for name in ("forward", "loss_compute", "backward", "optimizer_step"):
        assert int(sections[name]["count"]) == TRAIN, name
    # one more read: the one that finds the end of the data
    assert int(sections["read_sample"]["count"]) == TRAIN + 1
    assert sections["train_step_total"]["host_ms"] >= sections["forward"]["host_ms"]


# ---------------------------------------------------------------------- metrics.json
def test_metrics_json_has_one_record_per_phase(run: SimpleNamespace) -> None:
    records = _jsonl(run.folder / "metrics.json")
    assert [(r["phase_idx"], r["iteration"]) for r in records] == [(0, 4), (1, 4), (2, 8), (3, 8)]
    for r in records:
        split = "train" if r["phase_idx"] % 2 == 0 else "test"
        mean = sum(run.recorder.phase_losses[r["phase_idx"]]) / len(
            run.recorder.phase_losses[r["phase_idx"]]
        )
        assert r[f"{split}_loss"] == pytest.approx(mean, rel=1e-5)
        acc = r[f"{split}_accuracy_list_meter"]
        assert set(acc) == {"top_1", "top_5"}
        assert all(0.0 <= v <= 100.0 for v in acc["top_5"].values())
        other = "test" if split == "train" else "train"
        assert f"{other}_loss" not in r
    assert run.hooks[LogMetricsHook].last_metrics == records[-1]


# ---------------------------------------------------------------------- checkpoints
def test_checkpoints_written_by_the_run(run: SimpleNamespace) -> None:
    names = [n for _, _, n in list_checkpoints(str(run.folder))]
    # every 3 iterations (not at the last one), each train phase end; none at test phases
    assert sorted(names) == sorted(
        [
            "model_iteration3.torch",
            "model_iteration6.torch",
            "model_phase0.torch",
            "model_final_checkpoint_phase2.torch",
        ]
    )
    assert os.readlink(run.folder / "checkpoint.torch") == "model_final_checkpoint_phase2.torch"


class CheckpointTask:
    """The counters CheckpointHook reads, and a save_checkpoint that only records."""

    def __init__(self, num_train_phases: int, steps: int) -> None:
        self.num_train_phases, self.max_iteration = num_train_phases, num_train_phases * steps
        self.train, self.iteration, self.phase_idx, self.train_phase_idx = True, 0, -1, -1
        self.saved: list[tuple[str, bool, int]] = []

    def save_checkpoint(self, filename: str, phase_complete: bool, keep_last: int) -> str:
        self.saved.append((filename, phase_complete, keep_last))
        return filename


def test_checkpoint_hook_decides_when(tmp_path: Any) -> None:
    hook = CheckpointHook(str(tmp_path), phase_frequency=2, iter_frequency=4, keep_last=3)
    task = CheckpointTask(num_train_phases=5, steps=3)
    for _ in range(5):
        for is_train in (True, False):  # each train phase is followed by a test phase
            task.phase_idx += 1
            task.train = is_train
            task.train_phase_idx += int(is_train)
            for _ in range(3):
                task.iteration += int(is_train)
                hook.on_step(task)  # type: ignore[arg-type]
            hook.on_phase_end(task)  # type: ignore[arg-type]
    assert task.saved == [
        ("model_iteration4.torch", False, 3),
        ("model_phase2.torch", True, 3),  # the 2nd train phase (phase index 2)
        ("model_iteration8.torch", False, 3),
        ("model_iteration12.torch", False, 3),
        ("model_phase6.torch", True, 3),  # the 4th train phase
        # no model_iteration16: iteration 15 is the last and the final checkpoint follows
        ("model_final_checkpoint_phase8.torch", True, 3),
    ]
    assert hook.saved == [name for name, _, _ in task.saved]


def test_checkpoint_hook_removes_stale_temporary_files_at_start(tmp_path: Any) -> None:
    stale = tmp_path / ".tmp_model_phase0.torch"  # a write killed half-way
    stale.write_bytes(b"half a checkpoint")
    CheckpointHook(str(tmp_path)).on_start(CheckpointTask(1, 1))  # type: ignore[arg-type]
    assert not stale.exists()


# ---------------------------------------------------------------------- NaN check
class NanTask:
    """What CheckNanLossHook reads: the last batch and the counters."""

    def __init__(self, log_frequency: int) -> None:
        self.log_frequency = log_frequency
        self.train, self.iteration, self.local_iteration_num, self.phase_idx = True, 0, 0, 0
        self.last_batch: Any = None

    @property
    def is_log_iteration(self) -> bool:
        n = self.iteration if self.train else self.local_iteration_num + 1
        return n == 1 or n % self.log_frequency == 0

    def step(self, hook: CheckNanLossHook, loss: float, output: float = 0.0) -> None:
        self.iteration += 1
        self.local_iteration_num += 1
        self.last_batch = SimpleNamespace(
            loss=torch.tensor(loss),
            model_output=torch.full((2, 3), output),
            sample={"input": torch.ones(2, 3)},
        )
        hook.on_step(self)  # type: ignore[arg-type]


def test_nan_check_reads_the_losses_once_per_window(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = []
    hook, task = CheckNanLossHook(window=4), NanTask(log_frequency=4)
    for name in ("tolist", "item"):
        read = getattr(torch.Tensor, name)

        def counting(self: torch.Tensor, read: Any = read, name: str = name) -> Any:
            reads.append((task.iteration, name, self.numel()))
            return read(self)

        monkeypatch.setattr(torch.Tensor, name, counting)
    for _ in range(8):
        task.step(hook, 1.0)
    # iteration 1 (first log iteration), then 4 and 8: one read of two numbers each time
    # (the sum of the kept losses and of the last output, and the last loss, which the
    # log hooks of the step then share), whatever the steps kept
    assert reads == [(1, "tolist", 2), (4, "tolist", 2), (8, "tolist", 2)]
    assert hook._losses == []


def test_nan_check_names_the_first_bad_iteration_and_dumps_the_batch(tmp_path: Any) -> None:
    hook, task = CheckNanLossHook(window=4, dump_folder=str(tmp_path)), NanTask(4)
    task.step(hook, 1.0)
    task.step(hook, 1.0)
    task.step(hook, float("nan"))  # kept, not read yet: no error on this step
    with pytest.raises(FloatingPointError, match=r"non-finite loss nan at train iteration 3 "):
        task.step(hook, float("inf"))
    assert (tmp_path / "rank0_input_sample.pth").exists()
    assert torch.equal(torch.load(tmp_path / "rank0_model_output.pth"), torch.zeros(2, 3))


def test_nan_check_runs_before_a_save_and_at_phase_end() -> None:
    hook, task = CheckNanLossHook(window=10), NanTask(10)
    task.step(hook, 1.0)
    task.step(hook, float("nan"))
    with pytest.raises(FloatingPointError, match="iteration 2"):
        hook.before_save(task)  # type: ignore[arg-type]
    hook, task = CheckNanLossHook(window=10), NanTask(10)
    task.step(hook, 1.0)
    task.train = False
    task.local_iteration_num = 4  # a test phase names its own batch number
    task.step(hook, float("-inf"))
    with pytest.raises(FloatingPointError, match="at test iteration 5"):
        hook.on_phase_end(task)  # type: ignore[arg-type]


def test_nan_check_catches_a_non_finite_output_with_a_finite_loss() -> None:
    hook, task = CheckNanLossHook(window=1), NanTask(1)
    with pytest.raises(FloatingPointError, match="non-finite model output"):
        task.step(hook, 1.0, output=float("nan"))


def test_nan_check_is_not_fooled_by_sums() -> None:
    """The check reads sums first: a sum that overflows is not an error, and +inf and
    -inf (whose sum is nan) or a nan in one tensor of a list output are."""
    big = torch.finfo(torch.float32).max
    hook, task = CheckNanLossHook(window=2), NanTask(2)
    task.step(hook, big)
    task.step(hook, big, output=big)  # every sum is inf, every value finite
    assert hook._losses == []
    hook, task = CheckNanLossHook(window=1), NanTask(1)
    task.iteration += 1
    task.last_batch = SimpleNamespace(
        loss=torch.tensor(1.0),
        model_output=[torch.zeros(2), torch.tensor([float("inf"), -float("inf")])],
        sample={},
    )
    with pytest.raises(FloatingPointError, match="non-finite model output"):
        hook.on_step(task)  # type: ignore[arg-type]


class PoisonWeights(VisslHook):
    def on_update(self, task: SelfSupervisionTask) -> None:
        if task.iteration == 2:  # the counter moves after the step: this is step 3
            with torch.no_grad():
                next(task.base_model.parameters()).fill_(float("nan"))


def test_nan_check_stops_a_real_run_before_any_later_checkpoint(tmp_path: Any) -> None:
    cfg = tiny_config(tmp_path, "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2")
    with pytest.raises(FloatingPointError, match="train iteration 4 ") as info:
        train(cfg, [*default_hook_generator(cfg), PoisonWeights()])
    assert "config.HOOKS.CHECK_NAN=False" in str(info.value)
    names = [n for _, _, n in list_checkpoints(str(tmp_path))]
    assert names == ["model_iteration2.torch"]
    assert (tmp_path / "rank0_model_output.pth").exists()


# ---------------------------------------------------------------------- grad clipping
@pytest.mark.parametrize("norm_type", [2, "inf"])
def test_grad_clip_bounds_the_gradient_norm(norm_type: Any) -> None:
    model = nn.Linear(4, 3)
    for p in model.parameters():
        p.grad = torch.full_like(p, 10.0)
    task = SimpleNamespace(base_model=model, precision=Precision(), optimizer=None)
    GradClipHook(norm_type=norm_type, max_norm=0.5).on_backward(task)  # type: ignore[arg-type]
    p = float("inf") if norm_type == "inf" else 2.0
    grads = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
    assert torch.linalg.vector_norm(grads, ord=p).item() == pytest.approx(0.5, rel=1e-4)


# ---------------------------------------------------------------------- TensorBoard
@pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed")
def test_tensorboard_scalars_and_histograms(run: SimpleNamespace) -> None:
    events = EventAccumulator(str(run.folder / "tensorboard"), size_guidance={"histograms": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])

    def steps(tag: str) -> list[int]:
        return [e.step for e in events.Scalars(tag)]

    assert steps("Losses/train_loss") == LOG_ITERATIONS
    losses = [e.value for e in events.Scalars("Losses/train_loss")]
    assert losses == pytest.approx([run.recorder.loss[i] for i in LOG_ITERATIONS], rel=1e-5)
    assert steps("Learning_rate/train") == LOG_ITERATIONS
    assert steps("Losses/train_epoch_loss") == [0, 1]
    assert steps("Losses/test_epoch_loss") == [0, 1]
    assert "Meters/test_accuracy_list_meter/top_1/0" in scalars
    assert "Speed/forward_host_ms" in scalars  # perf stats go to the same writer
    histograms = events.Tags()["histograms"]
    assert any(t.startswith("Parameters/trunk") for t in histograms)
    assert any(t.startswith("Gradients/trunk") for t in histograms)
    assert run.hooks[SSLTensorboardHook].writer is None  # closed at the end
    assert not math.isnan(losses[-1])

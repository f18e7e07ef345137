"""The progress bar and the log lines, as a terminal or a log file receives them (#13).

A real tiny run (train, test, train, test; LOG_FREQUENCY 2, so the last step of each train
phase logs a line, and the meters are logged at each phase end) writes its log lines and
its progress bar into one fake output, the way a terminal or a SLURM log file gets both
stdout and stderr:

- on a terminal the finished bar of each phase is drawn exactly once (not redrawn after
  the last log line and then drawn again when it closes), and on the rendered screen no
  log line shares a line with a piece of a bar;
- in a file (stdout block-buffered, as Python buffers it when it is not a terminal)
  nothing is redrawn in place, each phase leaves one line with its finished bar, and no
  log line lands in the middle of a bar.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from tests._tiny_run import TEST_STEPS_PER_PHASE, TRAIN_STEPS_PER_PHASE, tiny_config
from tests._tiny_run import train_in_process as train
from vissl.hooks import VisslHook, default_hook_generator
from vissl.hooks.log_hooks import LogLossLrEtaHook
from vissl.utils.logger import _FORMAT, _SharedFormatter, _TqdmAwareHandler

TRAIN, TEST = TRAIN_STEPS_PER_PHASE, TEST_STEPS_PER_PHASE
PHASES = [
    ("train ep 1/2", TRAIN),
    ("test after ep 1", TEST),
    ("train ep 2/2", TRAIN),
    ("test after ep 2", TEST),
]
BAR = re.compile(r"\d+%\|")  # "100%|" and the like: a piece of a tqdm bar


class Output:
    """Where stdout and stderr both end up (a terminal, or a file with ``2>&1``)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.parts)


class FakeStream(io.TextIOBase):
    """A text stream into :class:`Output` with Python's buffering of stdout/stderr.

    Args:
        out: where the bytes go.
        tty: what ``isatty()`` says.
        buffering: "line" (a terminal's stdout), "block" (stdout to a file or pipe:
            written out on ``flush()`` only) or "none".
    """

    def __init__(self, out: Output, tty: bool, buffering: str) -> None:
        super().__init__()
        self.out, self.tty, self.buffering = out, tty, buffering
        self._pending: list[str] = []

    def isatty(self) -> bool:
        return self.tty

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if self.buffering == "none":
            self.out.parts.append(s)
        else:
            self._pending.append(s)
            if self.buffering == "line" and "\n" in s:
                self.flush()
        return len(s)

    def flush(self) -> None:
        if self._pending:
            self.out.parts.append("".join(self._pending))
            self._pending.clear()


def render(text: str) -> list[str]:
    """The screen a terminal shows for ``text``: ``\\r``, ``\\n`` (as CR LF) and
    cursor-up (``ESC[A``) handled, characters overwrite in place."""
    lines: list[list[str]] = [[]]
    row = col = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if text.startswith("\x1b[A", i):
            row = max(0, row - 1)
            i += 3
            continue
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row, col = row + 1, 0
            while len(lines) <= row:
                lines.append([])
        else:
            line = lines[row]
            line.extend(" " * (col + 1 - len(line)))
            line[col] = ch
            col += 1
        i += 1
    return ["".join(line).rstrip() for line in lines if "".join(line).strip()]


@pytest.fixture
def outputs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``make(tty)``: stdout and stderr into one :class:`Output`, the vissl logger on
    that stdout (as ``setup_logging`` sets it up), as a terminal (``tty=True``) or a log
    file."""
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("COLUMNS", "120")  # tqdm's width for a stream without a window
    monkeypatch.setenv("LINES", "40")
    vissl_logger = logging.getLogger("vissl")
    saved = (list(vissl_logger.handlers), vissl_logger.level, vissl_logger.propagate)
    handlers: list[logging.Handler] = []

    def make(tty: bool) -> Output:
        out = Output()
        stdout = FakeStream(out, tty, "line" if tty else "block")
        stderr = FakeStream(out, tty, "none")
        monkeypatch.setattr("sys.stdout", stdout)
        monkeypatch.setattr("sys.stderr", stderr)
        handler = _TqdmAwareHandler(stdout)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        for h in list(vissl_logger.handlers):
            vissl_logger.removeHandler(h)
        vissl_logger.addHandler(handler)
        vissl_logger.setLevel(logging.INFO)
        vissl_logger.propagate = False
        handlers.append(handler)
        return out

    yield make
    for h in handlers:
        vissl_logger.removeHandler(h)
    for h in saved[0]:
        vissl_logger.addHandler(h)
    vissl_logger.setLevel(saved[1])
    vissl_logger.propagate = saved[2]


def run_tiny(tmp_path: Any) -> None:
    cfg = tiny_config(tmp_path, "config.HOOKS.PROGRESS_BAR=True")
    train(cfg, default_hook_generator(cfg))


def finished(desc: str) -> str:
    """The start of the phase's finished bar."""
    return f"{desc}: 100%|"


def test_on_a_terminal_each_finished_bar_is_drawn_once(tmp_path: Any, outputs: Any) -> None:
    out = outputs(tty=True)
    run_tiny(tmp_path)
    text = out.text
    assert "iter: 4/8" in text and "iter: 8/8" in text  # the last train steps log a line
    for desc, total in PHASES:
        assert text.count(finished(desc)) == 1, desc
        assert f"| {total}/{total} [" in text
    screen = render(text)
    for desc, _ in PHASES:
        assert sum(finished(desc) in line for line in screen) == 1, desc
    logs = [line for line in screen if "INFO " in line]
    assert len(logs) >= 10
    for line in logs:
        assert line.startswith("INFO ") and not BAR.search(line), line
    # the last step's log line comes before the finished bar, the phase end after it
    first_bar = next(i for i, line in enumerate(screen) if finished(PHASES[0][0]) in line)
    assert "iter: 4/8" in screen[first_bar - 1]
    assert "phase 1/4 (train) done" in "\n".join(screen[first_bar + 1 :])


def test_in_a_log_file_each_phase_leaves_one_bar_line(tmp_path: Any, outputs: Any) -> None:
    out = outputs(tty=False)
    run_tiny(tmp_path)
    text = out.text
    assert "\r" not in text  # no redraws in place: they garble a file
    lines = text.splitlines()
    for desc, total in PHASES:
        bars = [line for line in lines if line.startswith(f"{desc}:")]
        assert len(bars) == 1, (desc, bars)
        assert bars[0].startswith(finished(desc)) and f"| {total}/{total} [" in bars[0]
        assert "it/s" in bars[0]
    assert "loss=" in next(line for line in lines if line.startswith("train ep 2/2:"))
    for line in lines:
        if "INFO " in line:
            assert line.startswith("INFO ") and not BAR.search(line), line
    # in order: phase 0's last log line, its bar, its end
    i_log = next(i for i, line in enumerate(lines) if "iter: 4/8" in line)
    i_bar = next(i for i, line in enumerate(lines) if line.startswith("train ep 1/2:"))
    i_end = next(i for i, line in enumerate(lines) if "phase 1/4 (train) done" in line)
    assert i_log < i_bar < i_end


def test_tqdm_disable_turns_the_bar_off_in_a_file(
    tmp_path: Any, outputs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = outputs(tty=False)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    run_tiny(tmp_path)
    assert "iter: 8/8" in out.text and not BAR.search(out.text)


class PhaseTask(SimpleNamespace):
    """What the hook reads in a phase of ``steps`` train steps."""

    def steps_per_phase(self, split: str) -> int:
        return int(self.steps)

    def phase_average_loss(self) -> float:
        return 0.0


def test_a_phase_resumed_mid_way_starts_the_bar_at_the_steps_done(
    tmp_path: Any, outputs: Any
) -> None:
    out = outputs(tty=False)
    hook = LogLossLrEtaHook(str(tmp_path))
    task = PhaseTask(
        train=True,
        train_phase_idx=0,
        num_train_phases=1,
        phase_idx=0,
        phases=[{"train": True}],
        steps=5,
        local_iteration_num=3,  # restored from a mid-phase checkpoint
        iteration=3,
        is_log_iteration=False,
    )
    hook.on_phase_start(task)  # type: ignore[arg-type]
    for _ in range(2):
        task.iteration += 1
        task.local_iteration_num += 1
        hook.on_step(task)  # type: ignore[arg-type]
    # the bar was completed and closed by the last step, before the phase end
    assert "train ep 1/1: 100%|" in out.text and "| 5/5 [" in out.text
    hook.on_phase_end(task)  # type: ignore[arg-type]
    assert out.text.count("train ep 1/1:") == 1


def test_log_lines_are_the_same_text_with_the_formatter_caches() -> None:
    """The logger formats a record once for stdout and log.txt, and the time once per
    second: the text is what logging's own formatter gives."""
    shared = _SharedFormatter(_FORMAT, datefmt="%H:%M:%S")
    plain = logging.Formatter(_FORMAT, datefmt="%H:%M:%S")
    for created in (1e9, 1e9 + 0.4, 1e9 + 0.999, 1e9 + 1.0, 1e9 + 3600.5, 1e9 + 1.2):
        record = logging.LogRecord("vissl.x", logging.INFO, __file__, 7, "loss %.3f", (1.5,), None)
        record.created = created
        expected = plain.format(record)
        assert shared.format(record) == expected
        assert shared.format(record) == expected  # the second handler's call
    other = logging.LogRecord("vissl.x", logging.INFO, __file__, 7, "x", (), None)
    other.created = 1e9 + 0.5
    assert shared.formatTime(other, "%H:%M:%S.") == plain.formatTime(other, "%H:%M:%S.")


class CrashAt(VisslHook):
    """Raise right after a train iteration (after the checkpoint hook saved it)."""

    priority = 1000

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def on_step(self, task: Any) -> None:
        if task.train and task.iteration == self.iteration:
            raise RuntimeError(f"simulated crash at {self.iteration}")


@pytest.mark.parametrize("workers", [0, 1])
def test_a_run_resumed_mid_phase_shows_the_whole_phase(
    tmp_path: Any, outputs: Any, workers: int
) -> None:
    """Resumed from iteration 2 of 4: the bar counts 2 -> 4 of 4 (without loader workers
    the sampler's length leaves the skipped batches out until its first batch)."""
    cfg = tiny_config(
        tmp_path,
        "config.HOOKS.PROGRESS_BAR=True",
        "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2",
        f"config.DATA.NUM_DATALOADER_WORKERS={workers}",
        "config.MULTI_PROCESSING_METHOD=fork",
    )
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, [*default_hook_generator(cfg), CrashAt(3)])
    out = outputs(tty=False)
    train(
        cfg, default_hook_generator(cfg), checkpoint_path=str(tmp_path / "model_iteration2.torch")
    )
    bars = [line for line in out.text.splitlines() if line.startswith("train ep 1/2:")]
    assert len(bars) == 1 and bars[0].startswith(finished("train ep 1/2"))
    assert f"| {TRAIN}/{TRAIN} [" in bars[0], bars[0]
    assert "iter: 4/8" in out.text  # the whole run's iterations, as before

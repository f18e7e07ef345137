"""Ctrl-C as a user presses it.

- In a terminal (a tmux session): the first Ctrl-C during ``quick_start`` finishes the
  step, leaves an iteration checkpoint, prints the command that resumes and exits with
  130; running that command ends with bitwise the weights of an uninterrupted run. A
  second Ctrl-C aborts at once, without a checkpoint or a traceback.
- Through the launcher with 2 processes (SIGINT sent to the launcher, as ``kill -INT``
  or a terminal would): the same, once forwarded to each worker.

The in-process details (end reasons, hooks, handlers): tests/trainer/test_interrupt.py.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration._runs import REPO
from tests.integration.test_exact_resume import assert_same, final_weights
from vissl.utils.checkpoint import list_checkpoints

TMUX = shutil.which("tmux")
needs_tmux = pytest.mark.skipif(TMUX is None, reason="tmux is not installed")
PLUGIN = os.path.join(REPO, "tests", "integration", "plugins", "ctrl_c_hooks.py")
#: quick_start, shortened to 2 epochs of 5 steps; LOG_FREQUENCY only changes the log.
QUICK = [
    "config=quick_start",
    "config.DATA.TRAIN.DATA_LIMIT=640",
    "config.OPTIMIZER.num_epochs=2",
    "config.LOG_FREQUENCY=1",
]
#: 2 processes, 40 steps of 2 samples each (a stop is agreed within 20 steps).
TWO_PROCESSES = [
    "config=test/cpu_test/tiny_simclr",
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
    "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 32]}]]",
    "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2",
    "config.DATA.TRAIN.DATA_LIMIT=160",
    "config.OPTIMIZER.num_epochs=1",
    "config.LOG_FREQUENCY=1",
]
SLOW_STEPS = [f"config.IMPORTS=[{PLUGIN}]", "config.HOOKS.CUSTOM_HOOKS=[{name: slow_steps}]"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(*overrides: str) -> list[str]:
    return [sys.executable, "tools/run_distributed_engines.py", *overrides]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def log_has(folder: Path, text: str) -> bool:
    path = folder / "log.txt"
    return path.exists() and text in path.read_text(errors="replace")


def checkpoint_names(folder: Path) -> list[str]:
    return [name for _, _, name in list_checkpoints(str(folder))]


class Terminal:
    """A command in a terminal: a detached tmux session of a private tmux server.

    The command runs in bash, which writes its exit status to a file once it ends and
    keeps the pane open, so that the screen can still be read.
    """

    def __init__(self, folder: Path, argv: list[str], name: str) -> None:
        assert TMUX is not None
        self.tmux = TMUX
        # a server of its own per terminal: a server an earlier test killed can still be
        # exiting on its socket, and a new session on that socket then fails
        self.socket = f"vissl-test-{os.getpid()}-{uuid.uuid4().hex[:8]}-{name}"
        self.rc_file = folder / f"{name}.rc"
        script = folder / f"{name}.sh"
        script.write_text(
            f"cd {shlex.quote(REPO)}\n"
            "export OMP_NUM_THREADS=1\n"
            "unset TQDM_DISABLE\n"  # progress bars, as a user sees them
            f"{shlex.join(argv)}\n"
            f"echo $? > {shlex.quote(str(self.rc_file))}\n"
            "sleep 600\n"
        )
        # a command given as several arguments is run directly, without a shell around it
        self._tmux("new-session", "-d", "-s", name, "-x", "200", "-y", "50", "bash", str(script))
        self.name = name

    def _tmux(self, *args: str) -> str:
        done = subprocess.run([self.tmux, "-L", self.socket, *args], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"tmux {' '.join(args[:1])} failed ({done.returncode}): {done.stderr.strip()}"
            )
        return done.stdout

    def ctrl_c(self) -> None:
        self._tmux("send-keys", "-t", self.name, "C-c")

    def screen(self) -> str:
        """Everything the pane showed, wrapped lines joined."""
        return self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", self.name)

    def exit_status(self, timeout: float) -> int:
        wait_for(lambda: self.rc_file.exists() and bool(self.rc_file.read_text()), timeout, "exit")
        return int(self.rc_file.read_text())

    def close(self) -> None:
        subprocess.run([self.tmux, "-L", self.socket, "kill-server"], capture_output=True)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Callable[..., Terminal]]:
    opened: list[Terminal] = []

    def open_terminal(argv: list[str], name: str = "train") -> Terminal:
        opened.append(Terminal(tmp_path, argv, name))
        return opened[-1]

    yield open_terminal
    for term in opened:
        term.close()


@pytest.mark.slow
@pytest.mark.integration
@needs_tmux
def test_ctrl_c_in_a_terminal_checkpoints_and_the_resumed_run_is_bitwise_exact(
    tmp_path: Path, terminal: Callable[..., Terminal]
) -> None:
    """Must-show: Ctrl-C during quick_start leaves an iteration checkpoint, and the
    resumed run ends with bitwise the weights of an uninterrupted run."""
    run, reference = tmp_path / "run", tmp_path / "reference"
    term = terminal(cli(*QUICK, f"config.CHECKPOINT.DIR={run}"))
    wait_for(lambda: log_has(run, "iter: 6/10"), 180, "iteration 6 (the first of phase 1)")
    term.ctrl_c()
    status = term.exit_status(60)
    screen = term.screen()
    assert status == 130, screen[-3000:]
    (name,) = checkpoint_names(run)
    stopped_at = int(name.removeprefix("model_iteration").removesuffix(".torch"))
    assert 6 <= stopped_at < 10  # mid phase 1
    assert "Ctrl-C (SIGINT) received" in screen and "Traceback" not in screen
    # the last thing on the screen: how to resume, as a command to copy
    hint = screen.split("To resume, run:\n", 1)[1].strip().splitlines()
    assert len(hint) == 1, screen[-2000:]
    command = shlex.split(hint[0])
    assert shutil.which(command[0]) == shutil.which(sys.executable)
    assert command[1:] == cli(*QUICK, f"config.CHECKPOINT.DIR={run}")[1:]

    resumed = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert log_has(run, f"resuming from {run / name}")
    assert log_has(run, "resumed inside phase 2/")  # (1-based)
    subprocess.run(
        cli(*QUICK, f"config.CHECKPOINT.DIR={reference}"),
        cwd=REPO,
        env=ENV,
        check=True,
        capture_output=True,
    )
    assert_same(final_weights(reference), final_weights(run))


@pytest.mark.slow
@pytest.mark.integration
@needs_tmux
def test_a_second_ctrl_c_in_a_terminal_aborts_at_once(
    tmp_path: Path, terminal: Callable[..., Terminal]
) -> None:
    run = tmp_path / "run"
    # from step 4 on, a step takes 30 s more: without the abort the exit would wait for it
    term = terminal(cli(*QUICK, f"config.CHECKPOINT.DIR={run}", *SLOW_STEPS))
    wait_for(lambda: log_has(run, "iter: 3/10"), 180, "iteration 3")
    term.ctrl_c()
    wait_for(lambda: log_has(run, "Ctrl-C (SIGINT) received"), 10, "the first Ctrl-C")
    pressed = time.monotonic()
    term.ctrl_c()
    status = term.exit_status(20)
    assert time.monotonic() - pressed < 5
    screen = term.screen()
    assert status == 130, screen[-3000:]
    assert "second Ctrl-C: aborting now" in screen
    assert "vissl: aborted by Ctrl-C" in screen and "Traceback" not in screen
    assert checkpoint_names(run) == []


@pytest.mark.integration
def test_sigint_to_the_launcher_of_2_processes_checkpoints_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    argv = cli(
        *TWO_PROCESSES, "config.CHECKPOINT.AUTO_RESUME=False", f"config.CHECKPOINT.DIR={run}"
    )
    proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: log_has(run, "iter: 3/40"), 180, "iteration 3")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    (name,) = checkpoint_names(run)
    assert name.startswith("model_iteration")
    stopped_at = int(name.removeprefix("model_iteration").removesuffix(".torch"))
    assert 3 < stopped_at < 40
    # one SIGINT per worker: each took it as the first Ctrl-C, none aborted
    assert "aborting" not in err and "Traceback" not in err and "failed" not in err
    assert err.rstrip().endswith(f"config.CHECKPOINT.DIR={run} config.CHECKPOINT.AUTO_RESUME=true")


@pytest.mark.integration
@pytest.mark.slow
def test_a_second_sigint_to_the_launcher_aborts_the_workers_at_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    argv = cli(*TWO_PROCESSES, *SLOW_STEPS, f"config.CHECKPOINT.DIR={run}")
    proc = subprocess.Popen(argv, cwd=REPO, env=ENV, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: log_has(run, "iter: 3/40"), 180, "iteration 3")
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: log_has(run, "Ctrl-C (SIGINT) received"), 10, "the first Ctrl-C")
        pressed = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - pressed
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert elapsed < 6  # not the 30 s the step still had to run
    assert "vissl: aborted by Ctrl-C" in err
    assert "Traceback" not in err and "failed" not in err
    assert checkpoint_names(run) == []

"""The lock of a run folder (#41 item 1): a second live run is refused with the holder's
name; a lock whose holder died (``kill -9``, a reused pid, a dead machine, a requeued SLURM
job) is taken over, by exactly one of the runs that find it at once.

The holders are light subprocesses that load ``vissl/launch/run_lock.py`` on its own (no
torch), so each test costs well under a second.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vissl.errors import RunFolderLockedError
from vissl.launch import run_lock
from vissl.launch.run_lock import LOCK_NAME, LockHolder, RunLock, stale_reason

REPO = Path(__file__).resolve().parents[2]

#: A process that takes the lock of argv[1], says so, and holds it until stdin closes.
HOLDER = f"""
import importlib.util, sys
sys.path.insert(0, {str(REPO)!r})
spec = importlib.util.spec_from_file_location("run_lock", {str(REPO / "vissl/launch/run_lock.py")!r})
mod = importlib.util.module_from_spec(spec)
sys.modules["run_lock"] = mod
spec.loader.exec_module(mod)
lock = mod.RunLock.acquire(sys.argv[1], "holder-run")
print("held", flush=True)
sys.stdin.read()
lock.release()
"""


def _start_holder(folder: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_live_run_is_refused_and_named(tmp_path):
    holder = _start_holder(tmp_path)
    try:
        with pytest.raises(RunFolderLockedError) as err:
            RunLock.acquire(str(tmp_path), "second-run", heartbeat=False)
        message = str(err.value)
        assert f"pid {holder.pid} on {socket.gethostname()}" in message
        assert "run holder-run" in message
        assert "config.CHECKPOINT.DIR=" in message and "<new folder>" in message
        assert err.value.key_path == "config.CHECKPOINT.DIR"
    finally:
        holder.communicate("")
    # released at its end: the folder is free again, and the lock file is gone
    assert not (tmp_path / LOCK_NAME).exists()
    RunLock.acquire(str(tmp_path), "third-run", heartbeat=False).release()


def test_a_holder_killed_with_sigkill_leaves_a_stale_lock_that_is_taken_over(tmp_path, caplog):
    holder = _start_holder(tmp_path)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / LOCK_NAME).exists()  # left behind by kill -9
    with caplog.at_level("WARNING", logger="vissl.launch.run_lock"):
        lock = RunLock.acquire(str(tmp_path), "after-crash", heartbeat=False)
    try:
        assert lock.taken_over == f"process {holder.pid} is no longer running"
        assert "took over the stale lock" in caplog.text and str(holder.pid) in caplog.text
        held = json.loads((tmp_path / LOCK_NAME).read_text())
        assert held["pid"] == os.getpid() and held["run_id"] == "after-crash"
    finally:
        lock.release()


def _write_lock(folder: Path, **fields: object) -> Path:
    me = LockHolder.this_process("me")
    data = {**me.__dict__, **fields}
    path = folder / LOCK_NAME
    path.write_text(json.dumps(data))
    return path


def test_a_reused_pid_or_a_reboot_is_not_taken_for_the_holder(tmp_path):
    me = LockHolder.this_process("me")
    parent = os.getppid()  # alive, but not the process that wrote the lock
    reused = LockHolder(me.host, parent, "old", "t", me.boot_id, -1)
    assert stale_reason(reused, 0.0, me) == f"pid {parent} now belongs to another process"
    if me.boot_id:
        rebooted = LockHolder(me.host, parent, "old", "t", "another-boot", None)
        assert "rebooted" in (stale_reason(rebooted, 0.0, me) or "")
    alive = LockHolder(me.host, parent, "old", "t", me.boot_id, run_lock.process_start_time(parent))
    assert stale_reason(alive, 0.0, me) is None


def test_another_hosts_lock_is_live_until_its_heartbeat_stops(tmp_path):
    path = _write_lock(tmp_path, host="another-node", pid=12345, job_id="")
    with pytest.raises(RunFolderLockedError, match="pid 12345 on another-node"):
        RunLock.acquire(str(tmp_path), "mine", heartbeat=False)
    old = time.time() - run_lock.STALE_AFTER_S - 60
    os.utime(path, (old, old))
    lock = RunLock.acquire(str(tmp_path), "mine", heartbeat=False)
    assert lock.taken_over is not None and "has not refreshed it" in lock.taken_over
    lock.release()


def test_a_requeued_slurm_job_takes_over_its_own_earlier_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    _write_lock(tmp_path, host="node-before-requeue", pid=777, job_id="4242")
    lock = RunLock.acquire(str(tmp_path), "requeued", heartbeat=False)
    assert "SLURM job 4242" in (lock.taken_over or "")
    lock.release()


def test_one_stale_lock_found_by_several_runs_at_once_goes_to_exactly_one(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lock(tmp_path, pid=dead.pid, process_start=None)
    barrier = threading.Barrier(6)
    won: list[RunLock] = []
    refused: list[str] = []

    def contend(i: int) -> None:
        barrier.wait()
        try:
            won.append(RunLock.acquire(str(tmp_path), f"contender-{i}", heartbeat=False))
        except RunFolderLockedError as err:
            refused.append(str(err))

    # Threads of one process share its pid: each contender is a distinct holder through
    # its own run id, and a live holder of this pid counts as alive (not stale).
    threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 5
    held = json.loads((tmp_path / LOCK_NAME).read_text())
    assert held["run_id"] == won[0].holder.run_id
    won[0].release()


def test_release_removes_only_its_own_lock(tmp_path):
    lock = RunLock.acquire(str(tmp_path), "first", heartbeat=False)
    path = tmp_path / LOCK_NAME
    path.unlink()
    _write_lock(tmp_path, host="another-node", pid=1, run_id="someone-else")
    lock.release()
    assert json.loads(path.read_text())["run_id"] == "someone-else"


def test_the_heartbeat_refreshes_the_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    lock = RunLock.acquire(str(tmp_path), "beating")
    path = tmp_path / LOCK_NAME
    old = time.time() - 1000
    os.utime(path, (old, old))
    deadline = time.time() + 5
    while time.time() - path.stat().st_mtime > 100 and time.time() < deadline:
        time.sleep(0.05)
    refreshed = time.time() - path.stat().st_mtime < 100
    lock.release()
    assert refreshed, "the holder did not refresh its lock"
    assert not path.exists()

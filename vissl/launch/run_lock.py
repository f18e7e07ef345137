"""The lock of a run folder: one live training run per ``CHECKPOINT.DIR``.

The launcher of global rank 0 (the in-process run, node 0's launcher, torchrun's rank 0)
takes the lock before it looks at the folder and holds it until training ends; the other
processes of the run never take it (they follow rank 0's resume choice). A second run
into the same folder is refused with :class:`~vissl.errors.RunFolderLockedError`, which
names the holder.

The lock is the file ``CHECKPOINT.DIR/vissl_run.lock``, a JSON object describing its
holder: ``host``, ``pid``, ``run_id``, ``started`` (ISO time), ``boot_id`` and
``process_start`` (so that a reused pid or a reboot is not taken for the holder),
``job_id`` (``SLURM_JOB_ID``) and ``command``. It is created atomically (written to a
temporary file, then hard-linked to its name: ``link`` fails when the name exists, also
on NFS), and its holder refreshes its modification time every :data:`HEARTBEAT_S`
seconds.

A lock whose holder is gone is *stale* and is taken over, with a warning naming it:

- on the same host, its process is no longer running (``kill -9``, a crash), its pid now
  belongs to another process, or the machine rebooted since;
- on any host, the same SLURM job (a requeued job is its own earlier run);
- from another host, its holder has not refreshed it for :data:`STALE_AFTER_S` seconds
  (the machine died, or its process was killed with its heartbeat).

Taking over is serialised by an exclusive ``flock`` on the stale lock file and a check that
the folder's lock is still that file, then an atomic replace: two runs that find one stale
lock at once do not both get it. The holder removes the lock when training ends, also on
an error, Ctrl-C or preemption; a run killed with ``-9`` leaves it behind, stale.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shlex
import socket
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from vissl.errors import RunFolderLockedError

logger = logging.getLogger(__name__)

#: The lock file's name in ``CHECKPOINT.DIR``.
LOCK_NAME = "vissl_run.lock"
#: Seconds between two refreshes of the lock file by its holder.
HEARTBEAT_S = 30.0
#: A lock of another host not refreshed for this long is stale.
STALE_AFTER_S = 600.0
#: Seconds a run waits for the exclusive flock of a stale lock before giving up.
TAKEOVER_WAIT_S = 10.0


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22, starttime
    except (IndexError, ValueError):
        return None


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].startswith("Z")


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (a killed one not yet reaped does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return not _is_zombie(pid)
    return not _is_zombie(pid)


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run folder's lock (the content of the lock file)."""

    host: str
    pid: int
    run_id: str
    started: str
    boot_id: str = ""
    process_start: int | None = None
    job_id: str = ""
    command: str = ""

    @classmethod
    def this_process(cls, run_id: str) -> LockHolder:
        pid = os.getpid()
        return cls(
            host=socket.gethostname(),
            pid=pid,
            run_id=str(run_id),
            started=datetime.now().astimezone().isoformat(timespec="seconds"),
            boot_id=_boot_id(),
            process_start=process_start_time(pid),
            job_id=os.environ.get("SLURM_JOB_ID", ""),
            command=shlex.join([os.path.basename(sys.executable), *sys.argv]),
        )

    @classmethod
    def from_json(cls, text: str) -> LockHolder | None:
        """The holder written in a lock file, or None when the text is not one."""
        try:
            data = json.loads(text)
            return cls(
                host=str(data["host"]),
                pid=int(data["pid"]),
                run_id=str(data.get("run_id", "")),
                started=str(data.get("started", "")),
                boot_id=str(data.get("boot_id", "")),
                process_start=(
                    int(data["process_start"]) if data.get("process_start") is not None else None
                ),
                job_id=str(data.get("job_id", "")),
                command=str(data.get("command", "")),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    def describe(self) -> str:
        job = f", SLURM job {self.job_id}" if self.job_id else ""
        command = f": {self.command}" if self.command else ""
        return (
            f"pid {self.pid} on {self.host} (run {self.run_id}, started {self.started}{job})"
            f"{command}"
        )


def stale_reason(
    holder: LockHolder | None, age_s: float, me: LockHolder | None = None
) -> str | None:
    """Why the lock of ``holder`` (last refreshed ``age_s`` seconds ago) is stale, or
    None when its holder may be alive.

    Args:
        holder: the lock file's content; None when it cannot be parsed.
        age_s: seconds since the lock file was last modified (its heartbeat).
        me: the process asking (default: this one).
    """
    me = me or LockHolder.this_process("")
    if holder is None:
        if age_s > STALE_AFTER_S:
            return f"it is unreadable and was not refreshed for {age_s:.0f} s"
        return None
    same_host = holder.host == me.host and (
        not holder.boot_id or not me.boot_id or holder.boot_id == me.boot_id
    )
    if holder.host == me.host and holder.boot_id and me.boot_id and holder.boot_id != me.boot_id:
        return f"{holder.host} rebooted since pid {holder.pid} took it"
    if same_host:
        if holder.pid == me.pid and holder.process_start == me.process_start:
            return None  # this very process (another launch in it still holds it)
        if not pid_alive(holder.pid):
            return f"process {holder.pid} is no longer running"
        start = process_start_time(holder.pid)
        if holder.process_start is not None and start is not None and start != holder.process_start:
            return f"pid {holder.pid} now belongs to another process"
        return None
    if holder.job_id and holder.job_id == me.job_id:
        return f"it was taken by an earlier run of SLURM job {holder.job_id} (requeued)"
    if age_s > STALE_AFTER_S:
        return (
            f"its holder on {holder.host} has not refreshed it for {age_s:.0f} s "
            f"(more than {STALE_AFTER_S:.0f} s: the machine or the process died)"
        )
    return None


def read_lock(path: str) -> tuple[LockHolder | None, float] | None:
    """``(holder, seconds since its last refresh)`` of the lock file, None if there is none."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
            age = time.time() - os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
        return None
    return LockHolder.from_json(text), max(0.0, age)


def _write_temporary(folder: str, holder: LockHolder) -> str:
    # (not ".tmp_*": vissl.utils.checkpoint.remove_stale_temporary_files removes those)
    fd, tmp = tempfile.mkstemp(prefix=".vissl_lock_", suffix=".new", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(holder.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    return tmp


def _locked_message(folder: str, path: str, holder: LockHolder | None, age_s: float) -> str:
    if holder is None:
        who = f"an unreadable lock file (refreshed {age_s:.0f} s ago)"
    else:
        who = f"another run: {holder.describe()}"
    return (
        f"config.CHECKPOINT.DIR={folder} is in use by {who}. Two runs in one folder "
        "would overwrite each other's checkpoints and mix their logs and metrics. Wait "
        "for that run to end, or give this one its own folder "
        "(config.CHECKPOINT.DIR=<new folder>). If no run is using the folder any more "
        f"(its machine died), delete {path}; a lock of this machine whose process is "
        f"gone, or one not refreshed for {STALE_AFTER_S:.0f} s, is taken over by itself."
    )


class RunLock:
    """The lock of one run folder, held by this process (see the module docstring).

    Use :meth:`acquire`; :meth:`release` (or leaving the ``with`` block) removes it.
    """

    def __init__(self, folder: str, holder: LockHolder) -> None:
        self.folder = folder
        self.path = os.path.join(folder, LOCK_NAME)
        self.holder = holder
        self._text = holder.to_json()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.taken_over: str | None = None  # why the lock it replaced was stale

    # ------------------------------------------------------------------ taking it
    @classmethod
    def acquire(cls, folder: str, run_id: str, heartbeat: bool = True) -> RunLock:
        """Take the lock of ``folder`` (created if needed) for run ``run_id``.

        Raises:
            RunFolderLockedError: another live run holds it (the message names it).
        """
        os.makedirs(folder, exist_ok=True)
        lock = cls(folder, LockHolder.this_process(run_id))
        for _ in range(5):
            if lock._create():
                break
            found = read_lock(lock.path)
            if found is None:
                continue  # released in between: try again
            holder, age = found
            reason = stale_reason(holder, age, lock.holder)
            if reason is None:
                raise RunFolderLockedError(_locked_message(folder, lock.path, holder, age))
            if lock._take_over(holder, reason):
                break
        else:
            found = read_lock(lock.path)
            holder, age = found if found is not None else (None, 0.0)
            raise RunFolderLockedError(_locked_message(folder, lock.path, holder, age))
        if heartbeat:
            lock._start_heartbeat()
        return lock

    def _create(self) -> bool:
        """Create the lock file if there is none; whether it was created."""
        tmp = _write_temporary(self.folder, self.holder)
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError as err:
            if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            # a file system without hard links: exclusive create, then write
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self._text)
                f.flush()
                os.fsync(f.fileno())
            return True
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _take_over(self, stale: LockHolder | None, reason: str) -> bool:
        """Replace the stale lock ``stale``; False when the folder's lock changed meanwhile."""
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return False
        except PermissionError:
            return False
        try:
            deadline = time.monotonic() + TAKEOVER_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        return False
                    time.sleep(0.05)
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                return False
            if current.st_ino != os.fstat(fd).st_ino:
                return False  # another run replaced it first
            with open(fd, encoding="utf-8", errors="replace", closefd=False) as f:
                f.seek(0)
                if LockHolder.from_json(f.read()) != stale:
                    return False
            tmp = _write_temporary(self.folder, self.holder)
            os.replace(tmp, self.path)
        finally:
            os.close(fd)  # (releases the flock)
        found = read_lock(self.path)
        if found is None or found[0] != self.holder:
            return False
        self.taken_over = reason
        logger.warning(
            "took over the stale lock of %s (%s): %s",
            self.folder,
            reason,
            stale.describe() if stale is not None else "unreadable",
        )
        return True

    # ------------------------------------------------------------------ holding it
    def is_mine(self) -> bool:
        """Whether the folder's lock file is still this process's."""
        found = read_lock(self.path)
        return found is not None and found[0] == self.holder

    def _start_heartbeat(self) -> None:
        self._thread = threading.Thread(
            target=self._beat, name=f"vissl-run-lock:{self.folder}", daemon=True
        )
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if not self.is_mine():
                    found = read_lock(self.path)
                    other = found[0] if found is not None else None
                    logger.error(
                        "the lock of %s is no longer this run's (%s): another run may be "
                        "writing into the same folder",
                        self.folder,
                        other.describe() if other is not None else "removed",
                    )
                    return
                os.utime(self.path)
            except OSError as err:  # a file system hiccup: try again at the next beat
                logger.debug("could not refresh %s: %s", self.path, err)

    def release(self) -> None:
        """Stop the heartbeat and remove the lock file if it is still this run's."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        with contextlib.suppress(OSError):
            if self.is_mine():
                os.unlink(self.path)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

"""Supervision of the worker processes of one node: start, wait, failures, preemption.

- When a process fails, the others are given a few seconds to stop, then terminated; the
  launcher raises with the traceback of the rank that failed first (a
  :class:`DistributedWorkerError`, or the worker's own :class:`~vissl.errors.VisslError`).
- SIGTERM / SIGUSR1 sent to the launcher are forwarded to the workers, which checkpoint
  and exit with :attr:`TrainingPreempted.exit_code`; the launcher then raises
  :class:`~vissl.errors.TrainingPreempted`.
- Ctrl-C (SIGINT): the workers run in process groups of their own, so a terminal's
  Ctrl-C reaches the launcher alone, which forwards one SIGINT per key press. The first
  makes the workers checkpoint and exit with :attr:`TrainingInterrupted.exit_code`
  (130); the launcher then raises :class:`~vissl.errors.TrainingInterrupted`. The second
  aborts them (SIGKILL after :data:`ABORT_GRACE_S` s) and the launcher raises
  ``KeyboardInterrupt``; a third kills them at once.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch.multiprocessing as mp
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from vissl.errors import ConfigError, TrainingInterrupted, TrainingPreempted, VisslError
from vissl.launch.worker import PRELOAD, Job, is_communication_error, worker_main

logger = logging.getLogger(__name__)

#: Seconds the other workers get to stop on their own after one fails, then again
#: after SIGTERM, before SIGKILL.
FAILURE_GRACE_S = 5.0
#: Seconds the workers get to exit after a second Ctrl-C, before SIGKILL.
ABORT_GRACE_S = 3.0


class DistributedWorkerError(RuntimeError):
    """A spawned worker process failed; the message holds its traceback."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class WorkerGroup:
    """The spawned workers of this node, their failures and their preemption."""

    def __init__(self, job: Job, start_method: str) -> None:
        self.job = job
        self.nproc = job.nproc
        self.start_method = start_method
        self.processes: list[Any] = []
        self.preemption_requested = False
        self.interrupts = 0  # SIGINTs (Ctrl-C) received while waiting for the workers

    def start(self) -> None:
        ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":
            # Workers fork from a server that imported torch and vissl once, instead of
            # each importing them (seconds each); only effective before it starts.
            ctx.set_forkserver_preload(list(PRELOAD))  # type: ignore[attr-defined]
        for local_rank in range(self.nproc):
            p = ctx.Process(  # type: ignore[attr-defined]
                target=worker_main, args=(local_rank, self.job), daemon=False
            )
            try:
                p.start()
            except (pickle.PicklingError, AttributeError, TypeError) as err:
                if self.start_method == "fork":
                    raise
                raise ConfigError(
                    f"config.MULTI_PROCESSING_METHOD={self.start_method} sends the config "
                    f"and hook_generator to each worker by pickling, which failed: {err}. "
                    "Pass a module-level function as hook_generator (not a lambda or a "
                    "local function), or use MULTI_PROCESSING_METHOD=fork.",
                    "config.MULTI_PROCESSING_METHOD",
                ) from err
            self.processes.append(p)

    def alive(self) -> list[Any]:
        return [p for p in self.processes if p.exitcode is None]

    def send(self, signum: int) -> None:
        for p in self.alive():
            try:
                os.kill(p.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> bool:
        """Wait until every worker has exited or ``timeout`` seconds passed."""
        deadline = time.monotonic() + timeout
        while self.alive():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            multiprocessing.connection.wait([p.sentinel for p in self.alive()], timeout=left)
        return True

    def stop(self) -> None:
        """SIGTERM, a grace period, then SIGKILL for whatever is still running."""
        if not self.alive():
            return
        self.send(signal.SIGTERM)
        if not self.wait(FAILURE_GRACE_S):
            self.send(signal.SIGKILL)
            self.wait(FAILURE_GRACE_S)

    def request_preemption(self, signum: int = signal.SIGUSR1) -> None:
        self.preemption_requested = True
        self.send(signum)

    def _is_preempted_exit(self, code: int | None) -> bool:
        if code == TrainingPreempted.exit_code:
            return True
        # Killed by the signal we forwarded before the trainer could handle it.
        return self.preemption_requested and code is not None and code < 0

    def _is_interrupted_exit(self, code: int | None) -> bool:
        if code == TrainingInterrupted.exit_code:
            return True
        # Killed after a second Ctrl-C.
        return self.interrupts > 1 and code is not None and code < 0

    def _failed(self) -> list[Any]:
        if self.interrupts > 1:
            return []  # aborted by the user: whatever the workers died of is no failure
        return [
            p
            for p in self.processes
            if p.exitcode not in (None, 0)
            and not self._is_preempted_exit(p.exitcode)
            and not self._is_interrupted_exit(p.exitcode)
        ]

    def join(self) -> None:
        """Wait for the workers; raise on failure or preemption."""
        with self._forward_signals():
            while self.alive() and not self._failed():
                if self.interrupts > 1:
                    if not self.wait(ABORT_GRACE_S):
                        self.send(signal.SIGKILL)
                        self.wait(FAILURE_GRACE_S)
                    break
                multiprocessing.connection.wait([p.sentinel for p in self.alive()], timeout=1.0)
            if self._failed() and self.alive():
                # Give the others a moment to notice (gloo fails fast on a dead peer).
                if not self.wait(FAILURE_GRACE_S):
                    self.stop()
        if self.interrupts > 1:
            raise KeyboardInterrupt
        failed = self._failed()
        if failed:
            raise self._failure(failed)
        if any(self._is_preempted_exit(p.exitcode) for p in self.processes):
            raise TrainingPreempted(
                f"the workers of node {self.job.ctx.node_id} stopped for preemption after "
                "saving a checkpoint"
            )
        if any(self._is_interrupted_exit(p.exitcode) for p in self.processes):
            raise TrainingInterrupted(
                f"training interrupted (Ctrl-C): the workers of node {self.job.ctx.node_id} "
                f"stopped; checkpoints are in {self.job.ctx.checkpoint_folder}",
                auto_resume=bool(self.job.ctx.cfg.CHECKPOINT.AUTO_RESUME),
            )

    @contextmanager
    def _forward_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def forward(signum: int, frame: Any) -> None:
            logger.warning("%s received: forwarding it to the workers", signal.Signals(signum).name)
            self.request_preemption(signum)

        def interrupt(signum: int, frame: Any) -> None:
            self.interrupts += 1
            if self.interrupts > 2:
                self.send(signal.SIGKILL)
                raise KeyboardInterrupt
            self.send(signal.SIGINT)  # the workers log what it does

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1)}
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, interrupt)
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _rank_of(self, p: Any) -> int:
        return self.job.rank_of(self.processes.index(p))

    @staticmethod
    def _message(failure: ProcessFailure) -> str:
        """The ``"Type: text"`` line of an error file (a dict in some torch versions)."""
        message: Any = failure.message
        if isinstance(message, dict):
            message = message.get("message", "")
        return str(message)

    def _records(self, failed: list[Any]) -> list[tuple[ProcessFailure, bool]]:
        """Elastic's view of each failed worker that left an error file, first failure
        first, a rank's own error before the communication errors of the ranks that
        lost their peer: ``(failure, is_communication_error)``."""
        records = []
        for p in failed:
            path = self.job.error_file(self._rank_of(p))
            if os.path.isfile(path):
                failure = ProcessFailure(self._rank_of(p), p.pid, p.exitcode or 1, path)
                records.append((failure, is_communication_error(self._message(failure))))
        records.sort(key=lambda r: (r[1], r[0].timestamp))
        return records

    def _failure(self, failed: list[Any]) -> BaseException:
        """The error to raise: the traceback of the rank that failed first.

        A rank's own error wins over the communication errors of the ranks that lost
        their peer; a rank that died without a traceback (killed, native crash) wins over
        communication errors too.
        """
        node = self.job.ctx.node_id
        records = self._records(failed)
        with_record = {r.local_rank for r, _ in records}
        silent = [p for p in failed if self._rank_of(p) not in with_record]
        lines = [f"rank {r.local_rank}: {self._message(r).splitlines()[0]}" for r, _ in records]
        lines += [f"rank {self._rank_of(p)}: {_describe_exit(p.exitcode)}" for p in silent]
        if silent and (not records or records[0][1]):
            p = silent[0]
            rank = self._rank_of(p)
            message = (
                f"rank {rank} of {self.job.world_size} (node {node}) "
                f"{_describe_exit(p.exitcode)} without a Python traceback (out of memory? a "
                "crash in native code? killed?). See its log."
            )
            others = [line for line in lines if not line.startswith(f"rank {rank}:")]
            if others:
                message += "\nother ranks:\n  " + "\n  ".join(others)
            return DistributedWorkerError(message, rank)
        first, communication = records[0]
        rank = first.local_rank  # the global rank: see _records
        callstack = first.error_file_data["message"].get("extraInfo", {}).get("py_callstack", "")
        message = (
            f"rank {rank} of {self.job.world_size} (node {node}, local rank "
            f"{rank - node * self.nproc}) failed:\n{callstack or self._message(first)}"
        )
        if len(lines) > 1:
            message += "\nother ranks stopped as a consequence:\n  " + "\n  ".join(lines[1:])
        if communication:
            message += (
                "\n(a communication error: a process on another node may have failed first; "
                "see that node's log)"
            )
        error = DistributedWorkerError(message, rank)
        pickled = first.error_file + ".pickle"
        if os.path.exists(pickled):
            try:
                with open(pickled, "rb") as f:
                    original = pickle.load(f)
                if isinstance(original, VisslError):
                    original.__cause__ = error
                    return original
            except Exception:
                pass
        return error


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


#: The worker group running on this node, for the SLURM preemption handler.
_ACTIVE_GROUP: WorkerGroup | None = None


def stop_workers_for_preemption(timeout: float) -> bool:
    """Ask this node's workers to checkpoint and exit (SIGUSR1); wait up to ``timeout``.

    Returns True when no worker is left running (they are killed after ``timeout``).
    Safe to call from a signal handler; a no-op when no worker runs.
    """
    group = _ACTIVE_GROUP
    if group is None or not group.alive():
        return True
    group.request_preemption(signal.SIGUSR1)
    if group.wait(timeout):
        return True
    logger.warning("workers did not stop within %.0f s after SIGUSR1; killing them", timeout)
    group.send(signal.SIGKILL)
    group.wait(FAILURE_GRACE_S)
    return False


def run_worker_group(job: Job, start_method: str) -> None:
    """Start this node's workers, wait for them, and clean up (also on failure).

    Raises:
        DistributedWorkerError | VisslError: a worker failed (see :meth:`WorkerGroup.join`).
        TrainingPreempted: the workers checkpointed and stopped for preemption.
    """
    global _ACTIVE_GROUP
    group = WorkerGroup(job, start_method)
    _ACTIVE_GROUP = group
    try:
        group.start()
        group.join()
    finally:
        group.stop()
        _ACTIVE_GROUP = None

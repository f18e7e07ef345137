"""Stopping early, agreed by every rank: preemption signals, Ctrl-C and stop requests.

A stop is asked for locally: SIGTERM / SIGUSR1 (preemption: the job is requeued), SIGINT
(Ctrl-C: the run is interrupted), or a hook calling ``task.request_stop(reason, kind)``
or setting ``task.stop_training`` (e.g. a profiler done with its window, early
stopping). With several processes a rank that stops alone would leave the others hanging
in a collective, so the ranks agree first, without a collective or a host read per step:

- at a check, each rank *starts* a non-blocking all-reduce (MAX) of its flag and of the
  time the steps since the last check took, on a CPU (gloo) group, and *reads* the one it
  started at the previous check, which has long completed. Every rank reads at the same
  step, so all ranks decide the same;
- checks are spaced in time, not in steps: the agreed (slowest rank's) step time sets
  the number of steps until the next check so that checks come about every
  ``check_seconds`` (at least every step, at most every ``check_every`` steps). Every
  rank computes the same spacing from the same agreed numbers. A stop asked at time t is
  agreed by about t + 2 * max(check_seconds, one step): with steps of several seconds,
  within two steps, well inside the minute SLURM leaves between SIGTERM and SIGKILL;
- at a phase end the ranks agree at once (a blocking all-reduce: phase ends synchronise
  anyway).

The side group is created with the gloo backend when the run's backend is NCCL. Gloo
talks over the network interface ``GLOO_SOCKET_IFNAME`` names (by default the one the
host name resolves to); when that interface cannot reach the other hosts, creating the
group fails with a :class:`~vissl.errors.DistributedSetupError` that says so.

One process needs no agreement: the flag is read every step (a Python attribute).

The flags are ordered by urgency and the all-reduce keeps the largest, so every rank
ends with the same, most urgent kind (``task.stop_kind``): requested < early_stop <
interrupted < preempted.

Ctrl-C: the first SIGINT asks for a stop of kind "interrupted" (the current step
finishes, a checkpoint is written, the process exits with
:attr:`~vissl.errors.TrainingInterrupted.exit_code` 130); a second one raises
``KeyboardInterrupt`` at once (no checkpoint), and from then on SIGINT kills the
process. A SIGINT that was ignored when training started (``SIG_IGN``, e.g. a background
job of a script) stays ignored.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from vissl.utils.distributed import get_world_size, gloo_group

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)

PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1")
#: Flag values; the all-reduce keeps the largest, so preemption wins over a plain stop.
NO_STOP, STOP, EARLY_STOP, INTERRUPT, PREEMPT = 0, 1, 2, 3, 4
#: ``task.stop_kind`` of each flag, and back.
KIND_OF_FLAG = {
    STOP: "requested",
    EARLY_STOP: "early_stop",
    INTERRUPT: "interrupted",
    PREEMPT: "preempted",
}
FLAG_OF_KIND = {kind: flag for flag, kind in KIND_OF_FLAG.items()}

_aborted = False


def aborted_by_user() -> bool:
    """Whether a second Ctrl-C aborted training in this process (no checkpoint)."""
    return _aborted


class StopController:
    """Signal handlers plus the rank agreement described in the module docstring.

    Args:
        check_every: the most steps between two agreements with several processes.
        check_seconds: the time aimed for between two agreements (the step time,
            agreed across ranks, sets how many steps that is).
        clock: seconds, monotonic (for tests).
    """

    def __init__(
        self,
        check_every: int = 10,
        check_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.check_every = max(1, int(check_every))
        self.check_seconds = float(check_seconds)
        self.clock = clock
        self.preempted = False
        self.signal_name = ""
        self.interrupts = 0  # SIGINTs received while installed
        self._previous: dict[int, Any] = {}
        self._group: Any = None
        self._steps = 0
        #: steps between checks, the same on every rank (from agreed numbers only)
        self.interval = 1
        self._last_check = 0.0
        #: [flag, milliseconds per step since the previous check], MAX over ranks
        self._buffer = torch.zeros(2, dtype=torch.int64)
        self._pending: Any = None

    # ------------------------------------------------------------------ set-up
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.preempted = True
        self.signal_name = signal.Signals(signum).name
        logger.warning("%s received: training stops after the current step", self.signal_name)

    def _on_interrupt(self, signum: int, frame: FrameType | None) -> None:
        global _aborted
        self.interrupts += 1
        if self.interrupts > 1:
            _aborted = True
            # a third Ctrl-C kills the process even if the abort itself is stuck
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            logger.warning("second Ctrl-C: aborting now, without saving a checkpoint")
            raise KeyboardInterrupt
        logger.warning(
            "Ctrl-C (SIGINT) received: training stops after the current step and saves a "
            "checkpoint; press Ctrl-C again to abort at once"
        )

    @property
    def interrupted(self) -> bool:
        return self.interrupts > 0

    def install(self) -> None:
        """Install the signal handlers (main thread only) and the agreement group."""
        global _aborted
        _aborted = False
        if threading.current_thread() is threading.main_thread():
            for name in PREEMPTION_SIGNALS:
                signum = getattr(signal, name, None)
                if signum is not None:
                    self._previous[signum] = signal.signal(signum, self._on_signal)
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_interrupt)
        if get_world_size() > 1:
            # A CPU group: the flag never touches the accelerator (NCCL needs GPU tensors).
            self._group = gloo_group()
            self._steps = 0
            self.interval = 1
            self._last_check = self.clock()

    def uninstall(self) -> None:
        """Restore the previous signal handlers; finish a pending agreement."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self._pending is not None:
            self._pending.wait()
            self._pending = None

    # ------------------------------------------------------------------ flags
    def _local_flag(self, task: SelfSupervisionTask) -> int:
        flag = PREEMPT if self.preempted else INTERRUPT if self.interrupted else NO_STOP
        if task.stop_training:
            # a hook that only set ``stop_training`` asked for a plain ("requested") stop
            kind = getattr(task, "stop_kind", "") or "requested"
            flag = max(flag, FLAG_OF_KIND.get(kind, STOP))
        return flag

    def _decide(self, task: SelfSupervisionTask, agreed: int) -> int:
        """Record on the task what every rank agreed; returns the agreed flag."""
        if agreed == NO_STOP:
            return agreed
        if agreed == PREEMPT and not self.preempted:
            self.preempted = True
            self.signal_name = self.signal_name or (
                "a stop request (preempted)" if task.stop_training else "preemption (another rank)"
            )
        if not task.stop_training:
            task.stop_training = True
            task.stop_training_reason = task.stop_training_reason or (
                "Ctrl-C (SIGINT)"
                if agreed == INTERRUPT and self.interrupted
                else self.signal_name
                if agreed == PREEMPT
                else f"another rank asked to stop ({KIND_OF_FLAG[agreed]})"
            )
        task.stop_kind = KIND_OF_FLAG[agreed]
        return agreed

    def after_step(self, task: SelfSupervisionTask) -> int:
        """The agreed flag after a step (NO_STOP or a stop flag); cheap every step."""
        if self._group is None:
            return self._decide(task, self._local_flag(task))
        self._steps += 1
        if self._steps < self.interval:
            return NO_STOP
        agreed = NO_STOP
        if self._pending is not None:
            self._pending.wait()  # started at the previous check: already complete
            agreed = int(self._buffer[0])
            # every rank reads the same agreed step time, so all space the next check alike
            self.interval = self._next_interval(int(self._buffer[1]))
        now = self.clock()
        step_ms = 1000.0 * (now - self._last_check) / max(1, self._steps)
        self._last_check = now
        self._steps = 0
        self._buffer[0] = self._local_flag(task)
        self._buffer[1] = max(1, round(step_ms))
        self._pending = dist.all_reduce(
            self._buffer, op=dist.ReduceOp.MAX, group=self._group, async_op=True
        )
        return self._decide(task, agreed)

    def _next_interval(self, step_ms: int) -> int:
        """Steps until the next check: about ``check_seconds``, within [1, check_every]."""
        steps = int(1000.0 * self.check_seconds / max(1, step_ms))
        return max(1, min(self.check_every, steps))

    def at_phase_end(self, task: SelfSupervisionTask) -> int:
        """The agreed flag at a phase end (blocking with several processes)."""
        if self._group is None:
            return self._decide(task, self._local_flag(task))
        agreed = NO_STOP
        if self._pending is not None:
            self._pending.wait()
            agreed = int(self._buffer[0])
            self._pending = None
        self._steps = 0
        self._last_check = self.clock()
        self._buffer[0] = max(agreed, self._local_flag(task))
        self._buffer[1] = 1
        dist.all_reduce(self._buffer, op=dist.ReduceOp.MAX, group=self._group)
        return self._decide(task, int(self._buffer[0]))

"""SIGTERM / SIGUSR1 handling: finish the current step, checkpoint, exit for requeue.

The handler only sets a flag. After each step the trainer asks :meth:`should_stop`;
with several processes the ranks agree through a small all-reduce on a CPU (gloo)
group, so they all stop after the same iteration.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from vissl.utils.distributed import get_world_size

logger = logging.getLogger(__name__)

PREEMPTION_SIGNALS = ("SIGTERM", "SIGUSR1")


class PreemptionHandler:
    """Installs the signal handlers for the duration of training."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self._previous: dict[int, Any] = {}
        self._group: Any = None
        self._flag = torch.zeros(1, dtype=torch.int32)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        logger.warning("%s received: training stops after the current step", self.signal_name)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals can only be handled in the main thread
        for name in PREEMPTION_SIGNALS:
            signum = getattr(signal, name, None)
            if signum is not None:
                self._previous[signum] = signal.signal(signum, self._on_signal)
        if get_world_size() > 1:
            self._group = (
                dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
            )

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def should_stop(self) -> bool:
        """Whether any rank has been asked to stop (a CPU collective with several ranks)."""
        if self._group is None:
            return self.requested
        self._flag.fill_(1 if self.requested else 0)
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group)
        if self._flag.item() and not self.requested:
            self.requested, self.signal_name = True, "preemption (another rank)"
        return bool(self._flag.item())

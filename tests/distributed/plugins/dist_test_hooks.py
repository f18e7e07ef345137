"""Hooks for the distributed tests, loaded in every worker through config.IMPORTS."""

import os
import signal

from vissl.hooks import VisslHook, register_hook
from vissl.utils.distributed import get_rank


@register_hook("raise_on_rank")
class RaiseOnRank(VisslHook):
    """Raise on one rank after a given training iteration (a user bug in a hook)."""

    def __init__(self, rank: int = 1, iteration: int = 2):
        self.rank = rank
        self.iteration = iteration

    def on_step(self, task):
        if get_rank() == self.rank and task.iteration == self.iteration:
            raise RuntimeError(
                f"deliberate failure on rank {self.rank} at iteration {self.iteration}"
            )


@register_hook("signal_launcher_once")
class SignalLauncherOnce(VisslHook):
    """At an iteration, rank 0 signals its launcher once per checkpoint folder (a
    scheduler preempting the job); a marker file stops the requeued run doing it again."""

    def __init__(self, iteration: int = 3, signal_name: str = "SIGUSR2"):
        self.iteration = iteration
        self.signal_name = signal_name

    def on_step(self, task):
        if get_rank() != 0 or task.iteration != self.iteration:
            return
        marker = os.path.join(task.checkpoint_folder, "preempted_once")
        if os.path.exists(marker):
            return
        with open(marker, "w") as f:
            f.write(str(task.iteration))
        os.kill(os.getppid(), getattr(signal, self.signal_name))


@register_hook("kill_rank")
class KillRank(VisslHook):
    """One rank dies without a Python traceback (as when the OOM killer strikes)."""

    def __init__(self, rank: int = 1, iteration: int = 2):
        self.rank = rank
        self.iteration = iteration

    def on_step(self, task):
        if get_rank() == self.rank and task.iteration == self.iteration:
            os.kill(os.getpid(), signal.SIGKILL)

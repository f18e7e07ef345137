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


@register_hook("stop_on_rank")
class StopOnRank(VisslHook):
    """One rank alone asks to stop training at a given iteration (e.g. an early-stopping
    hook that read a rank-local value)."""

    def __init__(self, rank: int = 1, iteration: int = 3):
        self.rank = rank
        self.iteration = iteration

    def on_step(self, task):
        if get_rank() == self.rank and task.iteration == self.iteration:
            task.stop_training = True
            task.stop_training_reason = f"rank {self.rank} asked at iteration {self.iteration}"


@register_hook("record_loss_state")
class RecordLossState(VisslHook):
    """Write the loss's parameters and buffers of each rank at start, for comparison."""

    def on_start(self, task):
        import torch

        state = {k: v.detach().cpu() for k, v in task.loss.state_dict().items()}
        torch.save(state, os.path.join(task.checkpoint_folder, f"loss_state_rank{get_rank()}.pt"))


from torch import nn  # noqa: E402

from vissl.losses import register_loss  # noqa: E402
from vissl.losses.simclr_info_nce_loss import SimclrInfoNCELoss  # noqa: E402


@register_loss("simclr_with_random_buffer")
class SimclrWithRandomBuffer(SimclrInfoNCELoss):
    """SimCLR plus state drawn at build time (as a queue or prototypes are): each rank
    draws its own, since ranks seed with SEED_VALUE + rank."""

    def __init__(self, temperature: float = 0.1):
        super().__init__(temperature=temperature)
        import torch

        self.register_buffer("queue", torch.randn(4, 8))
        self.prototypes = nn.Parameter(torch.randn(3, 8))

    @classmethod
    def from_config(cls, loss_config):
        return cls(temperature=loss_config.get("temperature", 0.1))

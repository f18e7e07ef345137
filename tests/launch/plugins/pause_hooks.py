"""A hook for the run-folder trials, loaded through config.IMPORTS."""

import os
import time

from vissl.hooks import VisslHook, register_hook


@register_hook("pause_after_first_phase")
class PauseAfterFirstPhase(VisslHook):
    """After the first phase (its checkpoint and metrics written), write ``paused`` and
    wait until ``resume`` exists (at most ``timeout`` s): a live run, standing still."""

    def __init__(self, paused: str, resume: str, timeout: float = 300.0):
        self.paused = paused
        self.resume = resume
        self.timeout = timeout

    def on_phase_end(self, task):
        if task.phase_idx != 0:
            return
        with open(self.paused, "w") as f:
            f.write("paused\n")
        deadline = time.time() + self.timeout
        while not os.path.exists(self.resume) and time.time() < deadline:
            time.sleep(0.1)

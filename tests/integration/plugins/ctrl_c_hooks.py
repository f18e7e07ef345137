"""A hook for tests/integration/test_ctrl_c.py, loaded through config.IMPORTS."""

import time

from vissl.hooks import VisslHook, register_hook


@register_hook("slow_steps")
class SlowSteps(VisslHook):
    """Every train step after iteration ``after`` takes ``seconds`` longer (a big model's
    forward), so that a test can press Ctrl-C twice within one step."""

    def __init__(self, after: int = 3, seconds: float = 30.0):
        self.after = after
        self.seconds = seconds

    def on_forward(self, task):
        if task.train and task.iteration >= self.after:
            time.sleep(self.seconds)

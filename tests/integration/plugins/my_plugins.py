"""A user's own plugin file, outside the package: a train step and a hook.

Named in config.IMPORTS by path; used by tests/integration/test_user_plugins.py.
"""

import json
import os

from vissl.hooks import VisslHook, register_hook
from vissl.hooks.base import HOOK_EVENTS
from vissl.trainer.train_steps import get_train_step, register_train_step
from vissl.utils.distributed import get_rank


@register_train_step("counting_train_step")
def counting_train_step(task):
    """Wraps the standard step and counts its calls."""
    task = get_train_step("standard_train_step")(task)
    task.additional_log_data["custom_step_calls"] = (
        task.additional_log_data.get("custom_step_calls", 0) + 1
    )
    task.custom_step_calls = getattr(task, "custom_step_calls", 0) + 1
    return task


@register_hook("event_counter")
class EventCounter(VisslHook):
    """Counts every event and writes the counts to events_rank{r}.json at the end."""

    def __init__(self, out_name: str = "events"):
        self.out_name = out_name
        self.counts = {e: 0 for e in HOOK_EVENTS}

    def _bump(self, event):
        self.counts[event] += 1

    def on_start(self, task):
        self._bump("on_start")

    def on_phase_start(self, task):
        self._bump("on_phase_start")

    def on_forward(self, task):
        self._bump("on_forward")

    def on_loss_and_meter(self, task):
        self._bump("on_loss_and_meter")

    def on_backward(self, task):
        self._bump("on_backward")

    def on_update(self, task):
        self._bump("on_update")

    def on_step(self, task):
        self._bump("on_step")

    def on_phase_end(self, task):
        self._bump("on_phase_end")

    def on_exception(self, task):
        self._bump("on_exception")

    def on_end(self, task):
        self._bump("on_end")
        out = os.path.join(task.checkpoint_folder, f"{self.out_name}_rank{get_rank()}.json")
        with open(out, "w") as f:
            json.dump(
                {"counts": self.counts, "custom_step_calls": getattr(task, "custom_step_calls", 0)},
                f,
            )

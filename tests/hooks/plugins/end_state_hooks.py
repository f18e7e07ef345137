"""A hook for the multi-process early-stopping test, loaded in every worker through
config.IMPORTS: each rank writes how its training ended."""

import json
import os

from vissl.hooks import HOOK_REGISTRY, VisslHook, register_hook
from vissl.utils.distributed import get_rank


class RecordEndState(VisslHook):
    """At the end, write ``end_rank{rank}.json``: phase, iteration and end reason."""

    def on_end(self, task):
        state = {
            "phase_idx": task.phase_idx,
            "iteration": task.iteration,
            "end_reason": getattr(task, "end_reason", ""),
            "stop_kind": getattr(task, "stop_kind", ""),
            "stop_training_reason": task.stop_training_reason,
        }
        path = os.path.join(task.checkpoint_folder, f"end_rank{get_rank()}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(state, f)


if "record_end_state" not in HOOK_REGISTRY:
    register_hook("record_end_state")(RecordEndState)

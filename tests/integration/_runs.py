"""Helpers to run configs end to end in tests."""

from __future__ import annotations

import json
import os
from typing import Any

from vissl.utils.distributed_launcher import launch_distributed
from vissl.utils.hydra_config import hydra_compose_and_validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_config(name: str, *overrides: str, hook_generator: Any = None) -> Any:
    """Compose, validate and train in this process (or spawn for several processes)."""
    root, cfg = hydra_compose_and_validate([f"config={name}", *overrides])
    return launch_distributed(
        cfg, node_id=0, engine_name=str(root.engine_name), hook_generator=hook_generator
    )


def read_jsonl(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]

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


def crash_and_resume_states(
    tmp_path: Any,
    config: str,
    overrides: list[str],
    crash_after: int,
    checkpoint_at: int,
    last: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``config`` uninterrupted, then again with a crash right after iteration
    ``crash_after`` and an auto-resume from the iteration checkpoint at ``checkpoint_at``;
    check the resumed iterations (``checkpoint_at + 1 .. last``) log the uninterrupted
    run's losses, bit for bit, and that every tensor of the final checkpoints (model and
    loss state) is equal. Returns the two final states (uninterrupted, resumed)."""
    import pytest

    from tests.integration.test_exact_resume import crash_generator
    from tests.integration.test_quick_dino_barlow import final_state
    from tests.integration.test_quick_vicreg import assert_bitwise_equal

    full = tmp_path / "full"
    run_config(config, *overrides, f"config.CHECKPOINT.DIR={full}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            config,
            *overrides,
            f"config.CHECKPOINT.DIR={crashed}",
            hook_generator=crash_generator(crash_after),
        )
    run_config(config, *overrides, f"config.CHECKPOINT.DIR={crashed}")
    assert "resumed inside phase" in (crashed / "log.txt").read_text()
    full_state, resumed_state = final_state(full), final_state(crashed)
    assert_bitwise_equal(full_state, resumed_state)
    expected = {r["iteration"]: r["loss"] for r in read_jsonl(str(full / "stdout.json"))}
    resumed = [
        r for r in read_jsonl(str(crashed / "stdout.json")) if r["iteration"] > checkpoint_at
    ]
    after = list(range(checkpoint_at + 1, last + 1))
    assert [r["iteration"] for r in resumed][-len(after) :] == after
    assert all(r["loss"] == expected[r["iteration"]] for r in resumed)
    return full_state, resumed_state

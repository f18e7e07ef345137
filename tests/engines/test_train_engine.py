"""The ``train`` engine's entry point, with a RunContext and with VISSL's arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._tiny_run import tiny_config
from vissl.engines.train import train_main


def test_train_main_takes_vissls_seven_arguments(tmp_path: Path) -> None:
    """A VISSL engine plugin calls train_main(cfg, dist_run_id, checkpoint_path,
    checkpoint_folder, local_rank, node_id, hook_generator)."""
    cfg = tiny_config(tmp_path, "config.TEST_MODEL=False", "config.OPTIMIZER.num_epochs=1")
    seen: list[object] = []

    def hooks(config: object) -> list[object]:
        seen.append(config)
        return []

    task = train_main(cfg, "local", None, str(tmp_path), 0, 0, hooks)
    assert len(seen) == 1
    assert task.iteration == 4
    assert (tmp_path / "log.txt").exists()  # the engine set up logging in that folder


def test_train_main_without_a_folder_says_what_is_missing() -> None:
    with pytest.raises(TypeError, match="needs checkpoint_folder"):
        train_main(object())

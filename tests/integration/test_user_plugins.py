"""A step and a hook from the user's own file, through config.IMPORTS, on 1 and 2 processes."""

from __future__ import annotations

import json
import os

import pytest

from tests.integration._runs import REPO, run_config

PLUGIN = os.path.join(REPO, "tests", "integration", "plugins", "my_plugins.py")


@pytest.mark.integration
@pytest.mark.parametrize(
    "nproc,start_method", [(1, "fork"), pytest.param(2, "forkserver", marks=pytest.mark.slow)]
)
def test_user_step_and_hook_run_with_right_event_counts(tmp_path, nproc, start_method):
    run_config(
        "test/cpu_test/tiny_simclr",
        f"config.IMPORTS=[{PLUGIN}]",
        "config.TRAINER.TRAIN_STEP_NAME=counting_train_step",
        "config.HOOKS.CUSTOM_HOOKS=[{name: event_counter, out_name: events}]",
        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}",
        f"config.MULTI_PROCESSING_METHOD={start_method}",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    # 16 samples, batch 4 per process, 2 epochs
    iters_per_epoch = 16 // (4 * nproc)
    steps = 2 * iters_per_epoch
    for rank in range(nproc):
        with open(tmp_path / f"events_rank{rank}.json") as f:
            result = json.load(f)
        assert result["custom_step_calls"] == steps
        assert result["counts"] == {
            "on_start": 1,
            "on_phase_start": 2,
            "on_forward": steps,
            "on_loss_and_meter": steps,
            "on_backward": steps,
            "on_update": steps,
            "on_step": steps,
            "on_phase_end": 2,
            "on_end": 1,
            "on_exception": 0,
        }
    assert (tmp_path / "model_final_checkpoint_phase1.torch").exists()

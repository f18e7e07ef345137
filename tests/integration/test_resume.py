"""Auto-resume at a phase boundary, and a finished run is not retrained."""

from __future__ import annotations

import pytest
import torch

from tests.integration._runs import run_config
from vissl.hooks import VisslHook
from vissl.utils.checkpoint import load_checkpoint

TINY = "test/cpu_test/tiny_simclr"


class FailAtPhase(VisslHook):
    def __init__(self, phase: int):
        self.phase = phase

    def on_phase_start(self, task):
        if task.phase_idx == self.phase:
            raise RuntimeError("simulated crash")


def _weights(path):
    return load_checkpoint(str(path))["classy_state_dict"]["base_model"]["model"]["trunk"]


@pytest.mark.integration
def test_resume_after_crash_matches_uninterrupted_run(tmp_path):
    from vissl.hooks import default_hook_generator

    common = ["config.CHECKPOINT.AUTO_RESUME=True", "config.OPTIMIZER.num_epochs=2"]
    run_config(TINY, *common, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")

    crashed = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_config(
            TINY,
            *common,
            f"config.CHECKPOINT.DIR={crashed}",
            hook_generator=lambda cfg: [*default_hook_generator(cfg), FailAtPhase(1)],
        )
    assert (crashed / "model_phase0.torch").exists()
    assert not list(crashed.glob("model_final*"))
    task = run_config(TINY, *common, f"config.CHECKPOINT.DIR={crashed}")
    assert task.iteration == 8 and task.phase_idx == 1

    full = _weights(tmp_path / "full" / "model_final_checkpoint_phase1.torch")
    resumed = _weights(crashed / "model_final_checkpoint_phase1.torch")
    assert full.keys() == resumed.keys()
    for k in full:
        assert torch.equal(full[k], resumed[k]), k

    # A finished run is not trained again.
    assert run_config(TINY, *common, f"config.CHECKPOINT.DIR={crashed}") is None

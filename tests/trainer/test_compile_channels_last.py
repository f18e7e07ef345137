"""MODEL.CHANNELS_LAST and MODEL.COMPILE.USE_COMPILE from config."""

from __future__ import annotations

import math

import pytest
import torch

from tests.integration._runs import run_config
from vissl.hooks import VisslHook, default_hook_generator
from vissl.utils.checkpoint import load_checkpoint

TINY = "test/cpu_test/tiny_simclr"


class Inspect(VisslHook):
    def on_forward(self, task):
        self.input_channels_last = task.last_batch.sample["input"].is_contiguous(
            memory_format=torch.channels_last
        )
        conv = next(m for m in task.base_model.modules() if isinstance(m, torch.nn.Conv2d))
        self.weight_channels_last = conv.weight.is_contiguous(memory_format=torch.channels_last)
        self.model_type = type(task.model).__name__


@pytest.mark.integration
def test_channels_last(tmp_path):
    hook = Inspect()
    task = run_config(
        TINY,
        "config.MODEL.CHANNELS_LAST=True",
        "config.OPTIMIZER.num_epochs=1",
        f"config.CHECKPOINT.DIR={tmp_path}",
        hook_generator=lambda cfg: [hook],
    )
    assert hook.input_channels_last and hook.weight_channels_last
    assert math.isfinite(task.phase_average_loss())


@pytest.mark.integration
def test_compile(tmp_path):
    hook = Inspect()
    # aot_eager exercises torch.compile (dynamo + AOT autograd) without minutes of inductor
    # code generation on a CPU.
    task = run_config(
        TINY,
        "config.MODEL.COMPILE.USE_COMPILE=True",
        "config.MODEL.COMPILE.BACKEND=aot_eager",
        "config.OPTIMIZER.num_epochs=1",
        "config.DATA.TRAIN.DATA_LIMIT=8",
        f"config.CHECKPOINT.DIR={tmp_path}",
        hook_generator=lambda cfg: [*default_hook_generator(cfg), hook],
    )
    assert hook.model_type == "OptimizedModule"
    assert math.isfinite(task.phase_average_loss())
    # checkpoints are written from the plain module: no "_orig_mod." prefixes
    (path,) = tmp_path.glob("model_final_checkpoint_phase0.torch")
    trunk = load_checkpoint(str(path))["classy_state_dict"]["base_model"]["model"]["trunk"]
    assert trunk and not any("_orig_mod" in k for k in trunk)

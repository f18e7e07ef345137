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
@pytest.mark.slow
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
@pytest.mark.slow
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


class InspectCopies(VisslHook):
    def on_start(self, task):
        self.encoder_compiled = task.loss.momentum_encoder._compiled_call_impl is not None
        self.ema_compiled = None

    def on_step(self, task):
        ema = next(h for h in task.hooks if type(h).__name__ == "EmaHook")
        self.ema_compiled = ema.model._compiled_call_impl is not None


@pytest.mark.integration
@pytest.mark.slow
def test_compile_reaches_the_momentum_encoder_and_the_ema(tmp_path):
    """#22 item 12: MODEL.COMPILE compiled the student only; MoCo's key encoder (and the
    EMA model when it runs forwards) stayed eager. Checkpoint keys do not change."""
    hook = InspectCopies()
    run_config(
        "test/integration_test/quick_moco",
        "config.MODEL.COMPILE.USE_COMPILE=True",
        "config.MODEL.COMPILE.BACKEND=eager",
        "config.OPTIMIZER.num_epochs=1",
        "config.HOOKS.EMA_MODEL.ENABLE_EMA_METERS=True",
        "config.METERS.names=[accuracy_list_meter]",
        f"config.CHECKPOINT.DIR={tmp_path}",
        hook_generator=lambda cfg: [*default_hook_generator(cfg), hook],
    )
    assert hook.encoder_compiled and hook.ema_compiled
    (path,) = tmp_path.glob("model_final_checkpoint_phase*.torch")
    loss = load_checkpoint(str(path))["classy_state_dict"]["loss"]
    assert any(k.startswith("momentum_encoder.trunk.") for k in loss)
    assert not any("_orig_mod" in k for k in loss)

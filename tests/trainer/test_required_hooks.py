"""``required_hooks()``: a loss or a train step declares the hooks it needs."""

from __future__ import annotations

import pytest

from tests.integration._runs import run_config
from vissl.hooks import VisslHook
from vissl.losses import LOSS_REGISTRY, register_loss
from vissl.losses.simclr_info_nce_loss import SimclrInfoNCELoss
from vissl.trainer.train_steps import TRAIN_STEP_REGISTRY, register_train_step
from vissl.trainer.train_steps.standard_train_step import StandardTrainStep

SMALL = [
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
    "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 32]}]]",
    "config.OPTIMIZER.num_epochs=1",
]


class CountSteps(VisslHook):
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.name = f"count_steps_{owner}"
        self.steps = 0

    def on_step(self, task):
        self.steps += 1

    def state_dict(self):
        return {"steps": self.steps}


@pytest.fixture
def declaring_plugins():
    @register_loss("test_loss_with_hooks")
    class LossWithHooks(SimclrInfoNCELoss):
        def required_hooks(self):
            return [CountSteps("loss")]

        @classmethod
        def from_config(cls, loss_config):
            return cls(temperature=0.1)

    @register_train_step("test_step_with_hooks")
    class StepWithHooks(StandardTrainStep):
        def required_hooks(self):
            return [CountSteps("step")]

    yield
    LOSS_REGISTRY.unregister("test_loss_with_hooks")
    TRAIN_STEP_REGISTRY.unregister("test_step_with_hooks")


@pytest.mark.integration
def test_hooks_declared_by_the_loss_and_the_step_run_and_are_checkpointed(
    tmp_path, declaring_plugins
):
    task = run_config(
        "test/cpu_test/tiny_simclr",
        *SMALL,
        "config.LOSS.name=test_loss_with_hooks",
        "config.TRAINER.TRAIN_STEP_NAME=test_step_with_hooks",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    declared = {h.name: h for h in task.hooks if isinstance(h, CountSteps)}
    assert set(declared) == {"count_steps_loss", "count_steps_step"}
    assert all(h.steps == task.iteration == 4 for h in declared.values())
    from vissl.utils.checkpoint import load_checkpoint

    (final,) = tmp_path.glob("model_final*.torch")
    saved = load_checkpoint(str(final))["classy_state_dict"]["hooks"]
    assert saved["count_steps_loss"] == {"steps": 4} and saved["count_steps_step"] == {"steps": 4}

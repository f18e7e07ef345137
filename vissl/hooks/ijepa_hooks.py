"""``IJEPAHook``: the target encoder of ``ijepa_loss``.

Declared by the loss through ``required_hooks()``; nothing checks the loss's name.

- ``on_forward``: the target encoder runs on the whole images (``sample["input"]["data"]``;
  no gradients, under the run's autocast); its layer-normed patch tokens go to
  ``loss.target_output``.
- ``on_update``: after each optimizer step the target encoder follows the model's trunk,
  ``target = m * target + (1 - m) * trunk``, ``m = loss.momentum_at(iteration,
  max_iteration)`` (I-JEPA's linear schedule), in one foreach lerp.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from vissl.errors import ConfigError
from vissl.hooks.base import Priority, VisslHook
from vissl.models.momentum import ema_update_

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask


class IJEPAHook(VisslHook):
    """Target-encoder forward and EMA update of ``ijepa_loss``.

    Args:
        loss: the loss whose target encoder this drives (``target_encoder``,
            ``run_target_encoder(images)``, ``momentum_at(iteration, max_iteration)``).
    """

    priority = Priority.HIGH

    def __init__(self, loss: Any) -> None:
        self.loss = loss
        #: the EMA factor of the last update (for logging and tests)
        self.last_momentum = float("nan")

    def on_forward(self, task: SelfSupervisionTask) -> None:
        inputs = task.last_batch.sample["input"]
        if not isinstance(inputs, Mapping) or "data" not in inputs:
            raise ConfigError(
                "ijepa_loss's target encoder needs the images as input 'data': set "
                "config.DATA.TRAIN.INPUT_KEY_NAMES: [data, mask, target_masks].",
                "config.DATA.TRAIN.INPUT_KEY_NAMES",
            )
        with torch.no_grad(), task.precision.autocast():
            self.loss.target_output = self.loss.run_target_encoder(inputs["data"])

    def on_update(self, task: SelfSupervisionTask) -> None:
        loss = self.loss
        if loss.target_encoder is None:
            raise RuntimeError("ijepa_loss.bind_model was not called: no target encoder.")
        momentum = loss.momentum_at(int(task.iteration), int(task.max_iteration))
        ema_update_(loss.target_encoder, task.base_model, momentum)
        self.last_momentum = momentum

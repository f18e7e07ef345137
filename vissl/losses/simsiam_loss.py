"""``simsiam_loss``: SimSiam's negative cosine with a stop-gradient, and its collapse check.

SimSiam (Chen & He, 2021) is BYOL without a momentum encoder: the model (trunk,
projector, predictor: ``MODEL.HEAD.PARAMS: [projector, predictor]``) predicts from one
view the projection of the other view by the *same* network, and the projection is
treated as a constant (stop-gradient). With ``p1, p2`` the predictions and ``z1, z2``
the projections of the two views (the predictor's inputs in the same forward pass,
kept by :class:`~vissl.losses.predictor_common.ProjectionCapture`)::

    loss = D(p1, stopgrad(z2)) / 2 + D(p2, stopgrad(z1)) / 2,   D(p, z) = -cos(p, z)

averaged over the batch (between -1 and 1; -1 when every prediction matches).

**Collapse.** All outputs equal is a minimum SimSiam can fall into (the paper's Sec. 4).
The loss keeps, on the device, the phase's mean per-dimension standard deviation of the
L2-normalised projections: about ``1 / sqrt(d)`` when the outputs spread over the
sphere, 0 when collapsed. :class:`SimSiamCollapseHook` (declared by the loss) reads it
once per train phase, logs it, and warns when it falls below
``collapse_threshold / sqrt(d)``.

The loss of a sample involves only that sample, so DDP's gradient average equals the
single-process gradient of the global batch: nothing is gathered.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from vissl.errors import ConfigError
from vissl.hooks.base import Priority, VisslHook
from vissl.losses import register_loss
from vissl.losses.predictor_common import (
    ProjectionCapture,
    captured_projection,
    checked_prediction,
    infer_predictor_config,
    two_views,
)
from vissl.utils.distributed import get_world_size, is_primary

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.simsiam_loss"


def negative_cosine(prediction: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """Per row ``-cos(p, stopgrad(z))``."""
    return -F.cosine_similarity(prediction, projection.detach(), dim=-1)


@register_loss("simsiam_loss")
class SimSiamLoss(nn.Module):
    """SimSiam loss (see the module docstring).

    Args:
        embedding_dim: the width of the projections and predictions.
        collapse_threshold: warn when the projections' per-dimension std falls below
            ``collapse_threshold / sqrt(embedding_dim)``.
    """

    def __init__(self, embedding_dim: int = 2048, collapse_threshold: float = 0.1) -> None:
        super().__init__()
        if (
            isinstance(embedding_dim, bool)
            or not isinstance(embedding_dim, int)
            or embedding_dim <= 0
        ):
            raise ConfigError(
                f"{_KEY}.embedding_dim must be a positive integer, got {embedding_dim!r}.",
                f"{_KEY}.embedding_dim",
            )
        self.embedding_dim = embedding_dim
        self.collapse_threshold = float(collapse_threshold)
        self.capture: ProjectionCapture | None = None
        # The phase's sum of per-step output std and the number of steps (on the device).
        self.register_buffer("std_sum", torch.zeros(2), persistent=False)
        self.std_sum: torch.Tensor

    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        """``embedding_dim`` from the head; a projector and a predictor of the same width.

        Raises:
            ConfigError: HEAD.PARAMS is not ``[projector, predictor]``, their output widths
                differ, or the transforms do not make 2 views.
        """
        infer_predictor_config(params, config, "simsiam_loss", "SimSiam")

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> SimSiamLoss:
        return cls(
            embedding_dim=params.get("embedding_dim", 2048),
            collapse_threshold=params.get("collapse_threshold", 0.1),
        )

    def bind_model(self, model: nn.Module) -> None:
        """Keep the projector's output of each forward (the predictor's input)."""
        if self.capture is not None:
            self.capture.remove()
        self.capture = ProjectionCapture(model)

    def required_hooks(self) -> list[Any]:
        return [SimSiamCollapseHook(self)]

    def forward(self, output: Any, target: Any = None) -> torch.Tensor:
        """The symmetrised SimSiam loss of this rank's batch; ``target`` is unused.

        Args:
            output: the predictions ``(2 * B, D)``, view-major (or a list of it).
            target: unused.
        """
        prediction = checked_prediction(output, "simsiam_loss", self.embedding_dim)
        projection = captured_projection(self.capture, prediction, "simsiam_loss")
        p1, p2 = two_views(prediction.float(), "simsiam_loss")
        z1, z2 = two_views(projection.float(), "simsiam_loss")
        if self.training:
            with torch.no_grad():
                std = F.normalize(z1, dim=1).std(dim=0).mean()
                self.std_sum.add_(torch.stack([std, torch.ones_like(std)]))
        return (negative_cosine(p1, z2) / 2 + negative_cosine(p2, z1) / 2).mean()

    def extra_repr(self) -> str:
        return f"embedding_dim={self.embedding_dim}"


class SimSiamCollapseHook(VisslHook):
    """Logs the projections' per-dimension std each train phase; warns on collapse.

    One host read per phase (at its end); the per-step statistic stays on the device.
    The value is this rank's (the primary's): collapse is a property of the model, which
    is the same on every rank.
    """

    priority = Priority.LOW

    def __init__(self, loss: SimSiamLoss) -> None:
        self.loss = loss
        #: The mean std of the last train phase (for logs and tests).
        self.last_std: float | None = None

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        self.loss.std_sum.zero_()

    def on_phase_end(self, task: SelfSupervisionTask) -> None:
        if not task.train:
            return
        total, steps = self.loss.std_sum.tolist()
        if steps == 0:
            return
        std = total / steps
        self.last_std = std
        healthy = 1.0 / math.sqrt(self.loss.embedding_dim)
        if not is_primary():
            return
        logger.info(
            "simsiam: per-dimension std of the normalised projections %.4f (1/sqrt(d) = "
            "%.4f; 0 is collapse)%s",
            std,
            healthy,
            f" on rank 0 of {get_world_size()}" if get_world_size() > 1 else "",
        )
        if std < self.loss.collapse_threshold * healthy:
            logger.warning(
                "simsiam: the projections have collapsed (std %.2e < %.2f / sqrt(d)): every "
                "image gets nearly the same output. Check the predictor (SimSiam needs it), "
                "lower the learning rate or weight decay, or use BatchNorm in the projector.",
                std,
                self.loss.collapse_threshold,
            )

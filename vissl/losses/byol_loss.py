"""``byol_loss``: BYOL's regression of the online prediction on the target projection.

BYOL (Grill et al., 2020) trains an *online* network (trunk, projector, predictor: the
model, ``MODEL.HEAD.PARAMS: [projector, predictor]``) to predict, from one view, the
*target* network's projection of the other view. The target network is the online
network without its predictor, never trained: after each optimizer step it moves
towards the online network, ``xi = m * xi + (1 - m) * theta``, with the cosine schedule
``m = 1 - (1 - m_base) * (cos(pi * k / K) + 1) / 2`` (``momentum`` is ``m_base``).

With ``p1, p2`` the online predictions of the two views and ``z1', z2'`` the target
projections, each L2-normalised, the symmetrised loss of a sample is::

    loss = ||p1 - z2'||^2 + ||p2 - z1'||^2 = (2 - 2 cos(p1, z2')) + (2 - 2 cos(p2, z1'))

averaged over the batch (the paper's ``L + L~``). No gradient reaches the target. The
loss of each sample involves only that sample, so the mean of every rank's loss (DDP's
gradient average) is the single-process loss of the global batch: nothing is gathered.

The target network is a submodule of the loss (``target_network``), hence in
``classy_state_dict["loss"]`` of every checkpoint; resume is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
import torch.nn.functional as F

from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.predictor_common import (
    MomentumTargetLoss,
    checked_prediction,
    infer_predictor_config,
    two_views,
)

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.byol_loss"


def regression_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row ``||p / |p| - z / |z| ||^2 = 2 - 2 cos(p, z)``."""
    return 2.0 - 2.0 * F.cosine_similarity(prediction, target, dim=-1)


@register_loss("byol_loss")
class BYOLLoss(MomentumTargetLoss):
    """BYOL loss with its target network (see the module docstring).

    Args:
        momentum: the target's EMA factor at iteration 0 (cosine schedule to 1).
        embedding_dim: the width of the projections and predictions.
    """

    def __init__(self, momentum: float = 0.99, embedding_dim: int = 256) -> None:
        super().__init__()
        if isinstance(momentum, bool) or not isinstance(momentum, int | float):
            momentum = float("nan")
        if not 0.0 <= float(momentum) <= 1.0:
            raise ConfigError(
                f"{_KEY}.momentum must be a number in [0, 1], got {momentum!r}.",
                f"{_KEY}.momentum",
            )
        if (
            isinstance(embedding_dim, bool)
            or not isinstance(embedding_dim, int)
            or embedding_dim <= 0
        ):
            raise ConfigError(
                f"{_KEY}.embedding_dim must be a positive integer, got {embedding_dim!r}.",
                f"{_KEY}.embedding_dim",
            )
        self.momentum = float(momentum)
        self.embedding_dim = embedding_dim

    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        """``embedding_dim`` from the head; a projector and a predictor of the same width.

        Raises:
            ConfigError: HEAD.PARAMS is not ``[projector, predictor]``, their output widths
                differ, or the transforms do not make 2 views.
        """
        infer_predictor_config(params, config, "byol_loss", "BYOL")

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> BYOLLoss:
        return cls(
            momentum=params.get("momentum", 0.99),
            embedding_dim=params.get("embedding_dim", 256),
        )

    def forward(
        self, output: Any, target: Any = None, *, teacher_output: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The symmetrised BYOL loss of this rank's batch; ``target`` is unused.

        Args:
            output: the online predictions ``(2 * B, D)``, view-major (or a list of it).
            target: unused.
            teacher_output: the target network's projections ``(2 * B, D)`` of the views.
        """
        prediction = checked_prediction(output, "byol_loss", self.embedding_dim)
        projection = self.given_teacher_output(teacher_output, "byol_loss")
        if projection.shape != prediction.shape:
            raise ValueError(
                f"byol_loss: target projections of shape {tuple(projection.shape)} for "
                f"predictions of shape {tuple(prediction.shape)}."
            )
        p1, p2 = two_views(prediction.float(), "byol_loss")
        z1, z2 = two_views(projection.detach().float(), "byol_loss")
        return (regression_loss(p1, z2) + regression_loss(p2, z1)).mean()

    def extra_repr(self) -> str:
        return f"embedding_dim={self.embedding_dim}, momentum={self.momentum}"

"""``barlow_twins_loss``: Barlow Twins' redundancy reduction on the global batch.

The batch holds two views of ``B`` samples, view-major (``simclr_collator`` or
``multicrop_collator`` with 2 crops): rows ``0..B-1`` are view A, ``B..2B-1`` view B.
The embeddings of every rank are gathered (with gradients) into the global batch of
``N = world_size * B`` rows per view. Each view is standardised on its own, over the
global batch, per dimension (the paper's ``BatchNorm1d(affine=False)``: mean 0, biased
variance 1)::

    c = z_A_norm.T @ z_B_norm / N                         # (D, D) cross-correlation
    loss = scale_loss * (sum_i (1 - c_ii)^2 + lambda_ * sum_{i != j} c_ij^2)

Normalising each view on its own (not the two jointly, as VISSL did) makes the loss
invariant to an affine change of one view: ``loss(x, y) == loss(x, 2 * y + 4)``.

Gradients under DDP: every rank computes the same loss on the gathered batch; the gather's
backward sums over ranks the gradient each rank sends to a row, and DDP averages over the
ranks, so each parameter receives exactly the gradient of the single-process loss on the
global batch (not ``1 / world_size`` of it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import nn

from vissl.config.params import IntAtLeast, NonNegative, Positive, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.config_inference import head_output_dim
from vissl.losses.predictor_common import check_two_views
from vissl.utils.distributed import gather_from_all

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.barlow_twins_loss"


def standardize(z: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Per-column ``(z - mean) / sqrt(var + eps)`` over the rows (biased variance)."""
    mean = z.mean(dim=0, keepdim=True)
    var = z.var(dim=0, unbiased=False, keepdim=True)
    return (z - mean) / torch.sqrt(var + eps)


@dataclass(kw_only=True, frozen=True)
class BarlowTwinsParams:
    """``config.LOSS.barlow_twins_loss``."""

    lambda_: Annotated[float, NonNegative] = 0.0051
    scale_loss: Annotated[float, Positive] = 0.024
    embedding_dim: Annotated[int, IntAtLeast(1)] = 8192
    eps: float = 1e-5


@register_loss("barlow_twins_loss")
class BarlowTwinsLoss(nn.Module):
    """Barlow Twins loss over the global batch.

    Args:
        lambda_: weight of the off-diagonal (redundancy) terms.
        scale_loss: factor applied to the whole loss.
        embedding_dim: width of the projector's output.
        eps: added to the variance when standardising.
    """

    Params = BarlowTwinsParams

    def __init__(
        self,
        lambda_: float = BarlowTwinsParams.lambda_,
        scale_loss: float = BarlowTwinsParams.scale_loss,
        embedding_dim: int = BarlowTwinsParams.embedding_dim,
        eps: float = BarlowTwinsParams.eps,
    ) -> None:
        super().__init__()
        p = parse(
            BarlowTwinsParams,
            {
                "lambda_": lambda_,
                "scale_loss": scale_loss,
                "embedding_dim": embedding_dim,
                "eps": eps,
            },
            _KEY,
        )
        self.lambda_ = p.lambda_
        self.scale_loss = p.scale_loss
        self.embedding_dim = p.embedding_dim
        self.eps = p.eps

    @classmethod
    def derive(cls, params: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with ``embedding_dim`` from the head's last ``dims`` entry (a new
        mapping); checks that the transforms make two views per sample.

        Raises:
            ConfigError: the transforms make other than 2 views per sample.
        """
        out = dict(params)
        head_dim = head_output_dim(config)
        if head_dim is not None and out.get("embedding_dim") != head_dim:
            logger.info("%s.embedding_dim set to %d, the head's output width", _KEY, head_dim)
            out["embedding_dim"] = head_dim
        check_two_views(config, _KEY, "Barlow Twins")
        return out

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> BarlowTwinsLoss:
        return cls(**vars(parse(BarlowTwinsParams, params, _KEY)))

    def cross_correlation(self, z_a: torch.Tensor, z_b: torch.Tensor) -> torch.Tensor:
        """The ``(D, D)`` cross-correlation of the global batch from this rank's rows."""
        z_a = gather_from_all(z_a.float())
        z_b = gather_from_all(z_b.float())
        n = z_a.shape[0]
        return standardize(z_a, self.eps).t() @ standardize(z_b, self.eps) / n

    def forward(self, output: Any, target: Any = None) -> torch.Tensor:
        """The loss of the global batch; ``target`` is unused.

        Args:
            output: ``(2 * B, D)`` embeddings, view-major (or a list holding them, or a
                list of the two views' tensors).
            target: unused.
        """
        if isinstance(output, torch.Tensor):
            outputs = [output]
        else:
            outputs = list(output)
        if len(outputs) == 2 and outputs[0].shape == outputs[1].shape:
            z_a, z_b = outputs
        elif len(outputs) == 1:
            z = outputs[0]
            if z.ndim != 2 or z.shape[0] % 2 != 0:
                raise ValueError(
                    f"barlow_twins_loss expects (2 * B, D) embeddings of 2 views, got "
                    f"{tuple(z.shape)}."
                )
            z_a, z_b = z.chunk(2, dim=0)
        else:
            raise ValueError(
                f"barlow_twins_loss expects one output tensor (both views), got {len(outputs)}."
            )
        if z_a.shape[1] != self.embedding_dim:
            raise ConfigError(
                f"{_KEY}.embedding_dim is {self.embedding_dim} but the model outputs "
                f"{z_a.shape[1]} columns; set it to the head's last dim.",
                f"{_KEY}.embedding_dim",
            )
        c = self.cross_correlation(z_a, z_b)
        diagonal = torch.diagonal(c)
        on_diag = (1.0 - diagonal).pow(2).sum()
        off_diag = c.pow(2).sum() - diagonal.pow(2).sum()
        return self.scale_loss * (on_diag + self.lambda_ * off_diag)

    def extra_repr(self) -> str:
        return (
            f"embedding_dim={self.embedding_dim}, lambda_={self.lambda_}, "
            f"scale_loss={self.scale_loss}"
        )

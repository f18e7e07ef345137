"""``vicreg_loss``: VICReg's invariance, variance and covariance terms on the global batch.

VICReg (Bardes, Ponce, LeCun, *VICReg: Variance-Invariance-Covariance Regularization for
Self-Supervised Learning*, ICLR 2022) trains the model (trunk and "expander", a projector
head) on two views of each image with three terms and no negatives, no momentum encoder
and no predictor. The batch holds two views of ``B`` samples, view-major
(``simclr_collator``, or ``multicrop_collator`` with 2 crops): rows ``0..B-1`` are the
embeddings ``Z`` of view 1, rows ``B..2B-1`` those ``Z'`` of view 2, ``D`` columns each.
The embeddings of every rank are gathered (with gradients) into the global batch of
``N = world_size * B`` rows per view, and every term is computed on it::

    inv = mean_{i, k} (z_ik - z'_ik)^2                       # F.mse_loss(Z, Z')
    v(Z) = mean_k relu(1 - sqrt(Var_k(Z) + eps))              # Var: unbiased, over N rows
    var = (v(Z) + v(Z')) / 2
    C(Z) = (Z - mean(Z)).T @ (Z - mean(Z)) / (N - 1)          # (D, D) covariance
    c(Z) = sum_{k != l} C(Z)_kl^2 / D
    cov = c(Z) + c(Z')
    loss = sim_coeff * inv + std_coeff * var + cov_coeff * cov

with ``sim_coeff = 25``, ``std_coeff = 25``, ``cov_coeff = 1``, ``eps = 1e-4`` by default.

**Normalisation: the authors' code, not the paper's equations.** This is the released
code's loss (``main_vicreg.py`` of facebookresearch/vicreg), for which the default
coefficients were tuned. Against the paper's equations it differs by two constant
factors, which only rescale the coefficients:

- the paper's invariance ``s(Z, Z') = 1/N sum_i ||z_i - z'_i||^2`` sums over the ``D``
  dimensions; the code (and the paper's Algorithm 1) takes ``F.mse_loss``, the mean over
  them: ``inv = s / D``;
- the paper weights ``mu * (v(Z) + v(Z'))`` (its eq. 6 and Algorithm 1); the code takes
  their mean, half of that (facebookresearch/vicreg issues #8 and #26): 25 here is the
  paper's ``mu = 12.5``.

The variance uses the unbiased estimate (``torch.var``'s default, as the code) and the
covariance the same ``N - 1``, with ``N`` the *global* batch (the code divides by its
``--batch-size``, the global one). ``gamma``, the target standard deviation, is 1.

**Where this differs from the code.** The code computes the invariance on each rank's
own ``B`` rows before gathering; here it is computed on the gathered rows. Both the
value (the mean over ``N * D`` entries is the mean of the ranks' means of equal size)
and the parameter gradients (below) are the same. The terms are computed in float32,
also under a bf16/fp16 autocast (the code runs them under fp16 autocast): an ``N``-row
covariance of ``D = 8192`` columns in half precision loses the small off-diagonal
entries the covariance term is about.

**Gradients under DDP.** Every rank computes the same loss on the gathered batch. The
gather's backward sums over ranks the gradient each rank's (identical) loss sends to a
row, so a rank's own rows receive ``world_size`` times the one-process gradient of those
rows, and DDP's average over ranks then gives each parameter exactly the gradient of the
one-process loss on the global batch (not ``1 / world_size`` of it). The code's
``FullGatherLayer`` (gather forward, all-reduce SUM backward) does the same.

**Logging.** ``forward`` returns ``{"loss": ..., "invariance": ..., "variance": ...,
"covariance": ...}``: the train step backpropagates ``loss`` and logs the three raw
(unweighted) terms as ``loss.invariance``, ``loss.variance`` and ``loss.covariance``.
They stay device tensors: the step stacks them with the loss into the one all-reduce it
runs for logging anyway, and the log hooks read them from the device only on
``LOG_FREQUENCY`` iterations, together with the loss (one read). With
``GRAD_ACCUMULATION_STEPS`` > 1 the logged terms are those of the step's last
micro-batch (the logged loss is the mean over the micro-batches).

The loss has no state: nothing of it goes into checkpoints and resume is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import nn

from vissl.config.params import Finite, IntAtLeast, NonNegative, Positive, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.config_inference import head_output_dim
from vissl.losses.predictor_common import check_two_views
from vissl.utils.distributed import gather_from_all

logger = logging.getLogger(__name__)

_NAME = "vicreg_loss"
_KEY = f"config.LOSS.{_NAME}"


@dataclass(kw_only=True, frozen=True)
class VICRegParams:
    """``config.LOSS.vicreg_loss`` (the paper's and its code's values). At least one of
    the three weights is > 0; ``eps`` > 0 keeps the gradient of the square root finite
    when a dimension collapses."""

    sim_coeff: Annotated[float, Finite, NonNegative] = 25.0
    std_coeff: Annotated[float, Finite, NonNegative] = 25.0
    cov_coeff: Annotated[float, Finite, NonNegative] = 1.0
    eps: Annotated[float, Finite, Positive] = 0.0001
    embedding_dim: Annotated[int, IntAtLeast(1)] = 8192

    def check(self, key_path: str) -> None:
        if self.sim_coeff == self.std_coeff == self.cov_coeff == 0.0:
            raise ConfigError(
                f"{key_path}: sim_coeff, std_coeff and cov_coeff are all 0, so the loss is "
                "constant; VICReg uses 25, 25 and 1.",
                f"{key_path}.sim_coeff",
            )


def variance_term(z: torch.Tensor, eps: float) -> torch.Tensor:
    """``mean_k relu(1 - sqrt(Var_k(z) + eps))``, unbiased variance over the rows."""
    std = torch.sqrt(z.var(dim=0) + eps)
    return F.relu(1.0 - std).mean()


def covariance_term(z: torch.Tensor) -> torch.Tensor:
    """Sum of the squared off-diagonal entries of ``z``'s covariance (``N - 1``), over D."""
    n, d = z.shape
    centred = z - z.mean(dim=0, keepdim=True)
    cov = centred.t() @ centred / (n - 1)
    return (cov.pow(2).sum() - torch.diagonal(cov).pow(2).sum()) / d


@register_loss(_NAME)
class VICRegLoss(nn.Module):
    """VICReg loss over the global batch (see the module docstring).

    Args:
        sim_coeff: weight of the invariance term (>= 0).
        std_coeff: weight of the variance term (>= 0).
        cov_coeff: weight of the covariance term (>= 0). At least one weight is > 0.
        eps: added to each variance under the square root (> 0: keeps the gradient of
            the square root finite when a dimension collapses).
        embedding_dim: the width of the embeddings (the head's output).
    """

    Params = VICRegParams

    def __init__(
        self,
        sim_coeff: float = VICRegParams.sim_coeff,
        std_coeff: float = VICRegParams.std_coeff,
        cov_coeff: float = VICRegParams.cov_coeff,
        eps: float = VICRegParams.eps,
        embedding_dim: int = VICRegParams.embedding_dim,
    ) -> None:
        super().__init__()
        p = parse(
            VICRegParams,
            {
                "sim_coeff": sim_coeff,
                "std_coeff": std_coeff,
                "cov_coeff": cov_coeff,
                "eps": eps,
                "embedding_dim": embedding_dim,
            },
            _KEY,
        )
        self.sim_coeff = p.sim_coeff
        self.std_coeff = p.std_coeff
        self.cov_coeff = p.cov_coeff
        self.eps = p.eps
        self.embedding_dim = p.embedding_dim

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
        check_two_views(config, _KEY, "VICReg")
        return out

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> VICRegLoss:
        return cls(**vars(parse(VICRegParams, params, _KEY)))

    def _views(self, output: Any) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = [output] if isinstance(output, torch.Tensor) else list(output)
        if len(outputs) == 2 and all(isinstance(o, torch.Tensor) for o in outputs):
            z_a, z_b = outputs
            if z_a.shape != z_b.shape or z_a.ndim != 2:
                raise ValueError(
                    f"vicreg_loss expects the two views' (B, D) embeddings, got shapes "
                    f"{tuple(z_a.shape)} and {tuple(z_b.shape)}."
                )
        elif len(outputs) == 1:
            z = outputs[0]
            if z.ndim != 2 or z.shape[0] % 2 != 0:
                raise ValueError(
                    f"vicreg_loss expects (2 * B, D) embeddings of 2 views, got {tuple(z.shape)}."
                )
            z_a, z_b = z.chunk(2, dim=0)
        else:
            raise ValueError(
                f"vicreg_loss expects one output tensor (both views), got {len(outputs)}."
            )
        if z_a.shape[1] != self.embedding_dim:
            raise ConfigError(
                f"{_KEY}.embedding_dim is {self.embedding_dim} but the model outputs "
                f"{z_a.shape[1]} columns; set it to the head's last dim.",
                f"{_KEY}.embedding_dim",
            )
        return z_a, z_b

    def terms(
        self, z_a: torch.Tensor, z_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The raw invariance, variance and covariance terms of the global batch, from
        this rank's ``(B, D)`` rows of each view (float32)."""
        with torch.autocast(device_type=z_a.device.type, enabled=False):
            z_a = gather_from_all(z_a.float())
            z_b = gather_from_all(z_b.float())
            if z_a.shape[0] < 2:
                raise ValueError(
                    "vicreg_loss needs at least 2 samples in the global batch (the variance "
                    f"and covariance are over the samples), got {z_a.shape[0]}."
                )
            invariance = F.mse_loss(z_a, z_b)
            variance = (variance_term(z_a, self.eps) + variance_term(z_b, self.eps)) / 2
            covariance = covariance_term(z_a) + covariance_term(z_b)
        return invariance, variance, covariance

    def forward(self, output: Any, target: Any = None) -> dict[str, torch.Tensor]:
        """The loss of the global batch and its three terms; ``target`` is unused.

        Args:
            output: ``(2 * B, D)`` embeddings, view-major (or a list holding them, or a
                list of the two views' tensors).
            target: unused.

        Returns:
            ``loss`` (backpropagated) and the detached raw terms ``invariance``,
            ``variance``, ``covariance`` (logged as ``loss.<term>``).
        """
        invariance, variance, covariance = self.terms(*self._views(output))
        loss = self.sim_coeff * invariance + self.std_coeff * variance + self.cov_coeff * covariance
        return {
            "loss": loss,
            "invariance": invariance.detach(),
            "variance": variance.detach(),
            "covariance": covariance.detach(),
        }

    def extra_repr(self) -> str:
        return (
            f"embedding_dim={self.embedding_dim}, sim_coeff={self.sim_coeff}, "
            f"std_coeff={self.std_coeff}, cov_coeff={self.cov_coeff}, eps={self.eps}"
        )

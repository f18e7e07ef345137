"""``moco_v3_loss``: MoCo v3's symmetric InfoNCE against a momentum encoder's keys.

MoCo v3 (Chen, Xie, He, *An Empirical Study of Training Self-Supervised Vision
Transformers*, ICCV 2021) drops MoCo's queue: the negatives of a query are the keys of the
other samples of the same (global) batch. The model is trunk, projector and predictor
(``MODEL.HEAD.PARAMS: [projector, predictor]``): its output on a view is the *query*
``q``. The *momentum encoder* is the model without its predictor (trunk and projector), a
frozen copy made once (``bind_model``); its output on a view is the *key* ``k``.

The paper's Algorithm 1, for a batch of ``N`` samples and two views ``x1, x2``::

    q1, q2 = f_q(x1), f_q(x2)          # queries: [N, C] each
    k1, k2 = f_k(x1), f_k(x2)          # keys: [N, C] each
    loss = ctr(q1, k2) + ctr(q2, k1)   # symmetrized
    loss.backward(); update(f_q)       # optimizer step
    f_k = m * f_k + (1 - m) * f_q      # momentum update

    def ctr(q, k):
        logits = mm(q, k.t())          # [N, N] pairs
        labels = range(N)              # positives are on the diagonal
        return 2 * tau * CrossEntropyLoss(logits / tau, labels)

with ``q`` and ``k`` L2-normalised. Here the batch is spread over ``W`` processes of ``B``
samples each (``N = W * B``): as in the paper's code, the keys of every rank are gathered
(rank order; no gradient: ``f_k`` is never trained), and a rank's ``B`` queries are
scored against all ``N`` keys. The positive of this rank's query ``i`` is the key of the
same sample, global row ``rank * B + i``::

    ctr(q, k) = 2 * tau * mean_i CE(q_i . [k_0, ..., k_{N-1}] / tau, rank * B + i)

**Gradients under DDP.** A rank's loss is the mean over its own ``B`` queries (as in the
paper's code); DDP averages the ranks' gradients. The loss of one process on the whole
batch is the mean over all ``N`` queries, the mean of the ranks' losses: its parameter
gradient is exactly DDP's average. (The gradient a rank's loss sends to its own
predictions is ``W`` times the one-process loss's gradient for those rows; DDP's ``1 / W``
makes the parameter gradients equal.) No gradient crosses ranks: the keys are constants.

**The momentum encoder** (the teacher, :class:`~vissl.losses.predictor_common.
MomentumTargetLoss`, driven by :class:`~vissl.hooks.momentum_teacher_hook.MomentumTeacherHook`)
runs on both views of ``sample["input"]`` after the model's forward (no gradients); its
keys reach ``forward`` as ``teacher_output``; after each optimizer step it moves towards the
model, ``m = 1 - (1 - momentum) * (cos(pi * k / K) + 1) / 2`` (MoCo v3's cosine schedule,
``--moco-m-cos``, from ``momentum`` at the first iteration to 1 at the last).

Two differences from the paper's code. The two views go through the model (and the
momentum encoder) in one forward of ``2B`` images, so BatchNorm layers see both views'
statistics together (the paper's code runs ``f_q(x1)`` and ``f_q(x2)`` separately; see
:mod:`vissl.losses.predictor_common`). And the momentum index is shifted by one
iteration: here the update after the optimizer step of iteration ``k - 1`` (the paper's
Algorithm 1) uses ``m(k - 1)``, so the keys of iteration ``k`` come from
``m(k - 1) * f_k + (1 - m(k - 1)) * f_q``; the paper's code (``main_moco.py``,
``adjust_moco_momentum`` then the update at the start of ``MoCo.forward``) blends the
same weights at the start of iteration ``k`` with ``m(k)``. The schedule moves by at most
``(1 - momentum) * pi / (2K)`` per iteration, so the two encoders differ negligibly.

The momentum encoder is a submodule of the loss (``target_network``), hence in
``classy_state_dict["loss"]`` of every checkpoint; resume is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F

from vissl.config.params import IntAtLeast, Positive, Unit, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.predictor_common import (
    MomentumTargetLoss,
    check_two_views,
    checked_prediction,
    projector_predictor_dims,
    two_views,
)
from vissl.utils.distributed import gather_from_all, get_rank

logger = logging.getLogger(__name__)

_NAME = "moco_v3_loss"
_KEY = f"config.LOSS.{_NAME}"


@dataclass(kw_only=True, frozen=True)
class MoCoV3Params:
    """``config.LOSS.moco_v3_loss`` (MoCo v3's values; ``embedding_dim`` is derived from
    the head)."""

    temperature: Annotated[float, Positive] = 0.2
    momentum: Annotated[float, Unit] = 0.99
    embedding_dim: Annotated[int, IntAtLeast(1)] = 256


def contrastive_loss(
    query: torch.Tensor, key: torch.Tensor, temperature: float, rank: int
) -> torch.Tensor:
    """The paper's ``ctr(q, k)`` of this rank's queries against the gathered keys.

    Args:
        query: this rank's ``(B, D)`` queries (predictions), L2-normalised.
        key: the ``(W * B, D)`` keys of every rank (rank order), L2-normalised.
        temperature: ``tau``.
        rank: this rank: its query ``i`` has the positive key ``rank * B + i``.

    Returns:
        ``2 * tau * mean_i CE(q_i . k^T / tau, rank * B + i)``.
    """
    logits = query @ key.t() / temperature
    batch = query.shape[0]
    labels = torch.arange(batch, device=query.device) + rank * batch
    return F.cross_entropy(logits, labels) * (2.0 * temperature)


@register_loss(_NAME)
class MoCoV3Loss(MomentumTargetLoss):
    """MoCo v3 loss with its momentum encoder (see the module docstring).

    Args:
        temperature: the softmax temperature ``tau`` (> 0).
        momentum: the momentum encoder's EMA factor at iteration 0, in [0, 1] (cosine
            schedule to 1 at the last iteration).
        embedding_dim: the width of the queries and keys.
    """

    Params = MoCoV3Params

    def __init__(
        self,
        temperature: float = MoCoV3Params.temperature,
        momentum: float = MoCoV3Params.momentum,
        embedding_dim: int = MoCoV3Params.embedding_dim,
    ) -> None:
        super().__init__()
        p = parse(
            MoCoV3Params,
            {"temperature": temperature, "momentum": momentum, "embedding_dim": embedding_dim},
            _KEY,
        )
        self.temperature = p.temperature
        self.momentum = p.momentum
        self.embedding_dim = p.embedding_dim

    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        """``embedding_dim`` from the head; queries and keys of one width; 2 views.

        Raises:
            ConfigError: HEAD.PARAMS is not ``[projector, predictor]``, the predictor's
                output width is not the projector's, or the transforms do not make 2
                views.
        """
        projection, prediction = projector_predictor_dims(config, _NAME)
        if projection != prediction:
            raise ConfigError(
                f"{_NAME} scores the predictor's outputs (queries) against the momentum "
                f"encoder's projections (keys): their widths must match, but "
                f"config.MODEL.HEAD.PARAMS makes keys of {projection} and queries of "
                f"{prediction}; end the predictor's dims with {projection}.",
                "config.MODEL.HEAD.PARAMS",
            )
        if params.get("embedding_dim") != projection:
            logger.info("%s.embedding_dim set to %d, the head's output width", _KEY, projection)
            params["embedding_dim"] = projection
        check_two_views(config, _KEY, "MoCo v3")

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> MoCoV3Loss:
        return cls(**vars(parse(MoCoV3Params, params, _KEY)))

    def forward(
        self, output: Any, target: Any = None, *, teacher_output: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``ctr(q1, k2) + ctr(q2, k1)`` of this rank's queries; ``target`` is unused.

        Args:
            output: the model's predictions ``(2 * B, D)``, view-major (or a list of it).
            target: unused.
            teacher_output: the momentum encoder's keys ``(2 * B, D)`` of the views.
        """
        prediction = checked_prediction(output, _NAME, self.embedding_dim)
        keys = self.given_teacher_output(teacher_output, _NAME)
        if keys.shape != prediction.shape:
            raise ValueError(
                f"{_NAME}: keys of shape {tuple(keys.shape)} for queries of shape "
                f"{tuple(prediction.shape)}."
            )
        # fp32 similarities and softmax, also under a bf16/fp16 autocast (a softmax at a
        # low temperature)
        with torch.autocast(device_type=prediction.device.type, enabled=False):
            q1, q2 = two_views(F.normalize(prediction.float(), dim=1), _NAME)
            k = F.normalize(keys.detach().float(), dim=1)
            two_views(k, _NAME)  # the shape check
            # every rank's keys in one collective, rank order: (W, 2 views, B, D).
            # Constants: gather_from_all keeps an autograd graph, and the keys have none.
            batch, dim = q1.shape
            gathered = gather_from_all(k).view(-1, 2, batch, dim)
            k1_all = gathered[:, 0].reshape(-1, dim)
            k2_all = gathered[:, 1].reshape(-1, dim)
            rank = get_rank()
            return contrastive_loss(q1, k2_all, self.temperature, rank) + contrastive_loss(
                q2, k1_all, self.temperature, rank
            )

    def extra_repr(self) -> str:
        return (
            f"embedding_dim={self.embedding_dim}, temperature={self.temperature}, "
            f"momentum={self.momentum}"
        )

"""``nnclr_loss``: NNCLR's InfoNCE with nearest-neighbour positives from a support set.

NNCLR (Dwibedi et al., *With a Little Help from My Friends: Nearest-Neighbor Contrastive
Learning of Visual Representations*, ICCV 2021) is SimCLR whose positive for a view is
not the other view's embedding but the **nearest neighbour** of the view's projection in
a *support set* ``Q`` of projections of earlier batches. The model is trunk, projector
and predictor (``MODEL.HEAD.PARAMS: [projector, predictor]``); its output is the
prediction ``p``, and the projection ``z`` of the same forward is the predictor's input
(kept by :class:`~vissl.losses.predictor_common.ProjectionCapture`).

With ``z1, z2`` the projections and ``p1, p2`` the predictions of the two views, all
L2-normalised, ``NN(z) = argmax_{q in Q} z . q`` (no gradient), the paper's eq. 2 with the
prediction head, symmetrised as in its Algorithm 1::

    loss = InfoNCE(NN(z1), p2) / 2 + InfoNCE(NN(z2), p1) / 2

    InfoNCE(a, b) = mean_i -log( exp(a_i . b_i / T) / sum_k exp(a_i . b_k / T) )

``i`` runs over this rank's samples and ``k`` over the GLOBAL batch: the predictions of
every rank are gathered, with gradients (the paper's denominator runs over the batch's
predictions of the other view, ``z_k^+``; there are no same-view negatives as in
SimCLR's NT-Xent). The main text's other symmetrisation (the same logits, softmax taken
over the support side, ``sum_k exp(NN(z_k) . p_i / T)``) is not used: this is the one of
the paper's pseudocode, which swaps the views.

**The support set.** A queue of ``queue_size`` normalised projections per rank: after the
loss, this rank's ``z1`` (view 1 only, detached, as ``update_queue(Q, z1)`` in the paper's
Algorithm 1) overwrite the oldest entries (circular). Every rank searches its own queue,
so the queues differ between ranks. The queue is used only once it is full ("filled
before it is used"): until ``queue_size`` projections have been written, the positive is
the (detached) projection itself, ``NN(z) := z``, so the first steps are SimCLR with a
stop-gradient on one side. The decision is a device-side ``torch.where`` on the count of
written projections: nothing is read back to the host per step.

**Checkpoints.** The queue and the count are per-rank state: they are not in
``state_dict()`` (non-persistent buffers, so rank 0's queue is never saved as everybody's);
:meth:`rank_state_dict` gives them to the checkpoint for each rank, and
:meth:`load_rank_state_dict` gives each rank its own back on resume. A run resumed with
another number of processes (or another queue size) starts with an empty queue.

**Gradients under DDP.** A rank's loss is the mean over its own rows; the gather's
backward sums over ranks what each rank's loss sends to a row, and DDP averages over the
ranks: each parameter gets the gradient of the mean over the global batch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.predictor_common import (
    ProjectionCapture,
    captured_projection,
    checked_prediction,
    infer_predictor_config,
    two_views,
)
from vissl.utils.distributed import gather_from_all, get_rank

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.nnclr_loss"


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"{_KEY}.{key} must be a positive integer, got {value!r}.", f"{_KEY}.{key}"
        )
    return value


def nearest_neighbours(z: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """For each row of ``z``, the row of ``support`` of highest dot product (the cosine
    similarity when both are L2-normalised); the first one on ties. No gradient."""
    with torch.no_grad():
        index = (z @ support.t()).argmax(dim=1)
        return support.index_select(0, index)


def info_nce_global(anchor: torch.Tensor, other: torch.Tensor, temperature: float) -> torch.Tensor:
    """``mean_i -log softmax_k(anchor_i . other_k / T)[i]`` over this rank's rows ``i``,
    ``k`` over ``other`` of every rank (gathered with gradients, rank order)."""
    others = gather_from_all(other)
    logits = anchor @ others.t() / temperature
    rows = anchor.shape[0]
    labels = torch.arange(rows, device=anchor.device) + get_rank() * rows
    return F.cross_entropy(logits, labels)


@register_loss("nnclr_loss")
class NNCLRLoss(nn.Module):
    """NNCLR loss with its per-rank support-set queue (see the module docstring).

    Args:
        temperature: the softmax temperature ``T`` (> 0).
        queue_size: projections in this rank's support set.
        embedding_dim: width of the projections and predictions.
    """

    queue: torch.Tensor
    written: torch.Tensor

    def __init__(
        self, temperature: float = 0.1, queue_size: int = 98304, embedding_dim: int = 256
    ) -> None:
        super().__init__()
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not temperature > 0
        ):
            raise ConfigError(
                f"{_KEY}.temperature must be a number > 0, got {temperature!r}.",
                f"{_KEY}.temperature",
            )
        self.temperature = float(temperature)
        self.queue_size = _positive_int(queue_size, "queue_size")
        self.embedding_dim = _positive_int(embedding_dim, "embedding_dim")
        # Per-rank state, saved through rank_state_dict (not state_dict).
        self.register_buffer(
            "queue", torch.zeros(self.queue_size, self.embedding_dim), persistent=False
        )
        #: projections written to the queue so far (the next slot is written % queue_size)
        self.register_buffer("written", torch.zeros((), dtype=torch.long), persistent=False)
        self.capture: ProjectionCapture | None = None

    # ------------------------------------------------------------------ config
    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        """``embedding_dim`` from the head; a projector and a predictor of the same width
        (the support set's projections meet the predictions in one dot product).

        Raises:
            ConfigError: HEAD.PARAMS is not ``[projector, predictor]``, their output widths
                differ, or the transforms do not make 2 views.
        """
        infer_predictor_config(params, config, "nnclr_loss", "NNCLR")

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> NNCLRLoss:
        return cls(
            temperature=params.get("temperature", 0.1),
            queue_size=params.get("queue_size", 98304),
            embedding_dim=params.get("embedding_dim", 256),
        )

    def bind_model(self, model: nn.Module) -> None:
        """Keep the projector's output of each forward (the predictor's input)."""
        if self.capture is not None:
            self.capture.remove()
        self.capture = ProjectionCapture(model)

    # ------------------------------------------------------------------ per-rank state
    def rank_state_dict(self) -> dict[str, Any]:
        """This rank's support set and its count of written projections."""
        return {"queue": self.queue.detach().clone(), "written": self.written.detach().clone()}

    def load_rank_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`rank_state_dict` gave on this rank (an empty queue when the
        saved one has another shape)."""
        queue = state.get("queue")
        if queue is None or "written" not in state:
            return
        if tuple(queue.shape) != tuple(self.queue.shape):
            logger.warning(
                "nnclr_loss: the support set is not restored: saved shape %s, this run's %s "
                "(queue_size or embedding_dim changed); it fills again.",
                tuple(queue.shape),
                tuple(self.queue.shape),
            )
            return
        self.queue.copy_(queue.to(self.queue.device))
        self.written.copy_(torch.as_tensor(state["written"]).to(self.written.device))

    # ------------------------------------------------------------------ queue
    def is_full(self) -> torch.Tensor:
        """A 0-dim bool tensor on the queue's device: whether the support set is in use."""
        return self.written >= self.queue_size

    def support(self, z: torch.Tensor) -> torch.Tensor:
        """The positives of the normalised projections ``z``: their nearest neighbours in
        the support set once it is full, ``z`` itself (detached) before."""
        z = z.detach()
        return torch.where(self.is_full(), nearest_neighbours(z, self.queue), z)

    @torch.no_grad()
    def enqueue(self, z: torch.Tensor) -> None:
        """Write the normalised projections ``z`` over the oldest entries (circular)."""
        n = int(z.shape[0])
        keys = z.detach().to(self.queue.dtype)
        skip = max(0, n - self.queue_size)  # more rows than slots: the last ones stay
        keys = keys[skip:]
        index = (self.written + skip + torch.arange(keys.shape[0], device=keys.device)) % (
            self.queue_size
        )
        self.queue.index_copy_(0, index, keys)
        self.written.add_(n)

    # ------------------------------------------------------------------ loss
    def forward(self, output: Any, target: Any = None) -> torch.Tensor:
        """The symmetrised NNCLR loss of this rank's rows; ``target`` is unused. In
        training mode, this rank's view-1 projections are enqueued afterwards.

        Args:
            output: the predictions ``(2 * B, D)``, view-major (or a list holding them).
            target: unused.
        """
        prediction = checked_prediction(output, "nnclr_loss", self.embedding_dim)
        projection = captured_projection(self.capture, prediction, "nnclr_loss")
        # fp32 similarities and softmax, also under a bf16/fp16 autocast
        with torch.autocast(device_type=prediction.device.type, enabled=False):
            p1, p2 = two_views(F.normalize(prediction.float(), dim=1), "nnclr_loss")
            z1, z2 = two_views(F.normalize(projection.detach().float(), dim=1), "nnclr_loss")
            nn1, nn2 = self.support(z1), self.support(z2)
            loss = (
                info_nce_global(nn1, p2, self.temperature)
                + info_nce_global(nn2, p1, self.temperature)
            ) / 2
            if self.training:
                self.enqueue(z1)
        return loss

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, queue_size={self.queue_size}, "
            f"embedding_dim={self.embedding_dim}"
        )

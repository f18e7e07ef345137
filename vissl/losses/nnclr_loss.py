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

**The support set.** One queue of ``queue_size`` normalised projections, the same on
every rank, as the paper's single support set (and VISSL's NNCLR pull request, whose
``queue_size`` is this one's): after the loss, the view-1 projections ``z1`` of every rank
(detached, as ``update_queue(Q, z1)`` in the paper's Algorithm 1) are gathered in rank
order and overwrite the oldest entries (circular), as MoCo's queue is filled
(:meth:`vissl.losses.moco_loss.MoCoLoss.dequeue_and_enqueue`). Every search therefore
covers the whole support set, whatever the number of ranks, and a step writes the
global batch's ``W * B`` projections. The queue is used only once it is full ("filled
before it is used"): until ``queue_size`` projections have been written, the positive is
the (detached) projection itself, ``NN(z) := z``, so the first steps are SimCLR with a
stop-gradient on one side. The decision is a device-side ``torch.where`` on the count of
written projections: nothing is read back to the host per step.

**Checkpoints.** The queue and the count (``queue``, ``written``) are in
``state_dict()``, hence in ``classy_state_dict["loss"]``; a queue of another size or width
than the run's is not loaded (a warning; it fills again). Checkpoints written before the
queue was global (each rank's own queue under ``per_rank[r]["loss"]``, an empty
``classy_state_dict["loss"]``) still load: :meth:`load_rank_state_dict` receives each
rank's old queue, the ranks' queues are gathered and written oldest entry first, rank 0's
queue first, into the global queue. A 1-process checkpoint's queue is thus the whole
support set; one of W processes resumed on W processes gives the W queues one after the
other. (Resumed on another number of processes, the checkpoint code hands the loss no
per-rank state, with a warning, and the queue fills again.)

**Gradients under DDP.** A rank's loss is the mean over its own rows; the gather's
backward sums over ranks what each rank's loss sends to a row, and DDP averages over the
ranks: each parameter gets the gradient of the mean over the global batch.

``nnclr_info_nce_loss`` is the same loss under the name and keys of VISSL's NNCLR pull
request (``temperature``, ``queue_size``, ``buffer_params.embedding_dim``,
``prediction_head_params``): :class:`NNCLRInfoNCELoss`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, MutableMapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses._checks import build_from_params
from vissl.losses.predictor_common import (
    ProjectionCapture,
    _module_specs,
    captured_projection,
    checked_prediction,
    infer_predictor_config,
    two_views,
)
from vissl.utils.distributed import gather_from_all, get_rank

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.nnclr_loss"
_VISSL_KEY = "config.LOSS.nnclr_info_nce_loss"
_HEAD_KEY = "config.MODEL.HEAD.PARAMS"


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


def oldest_first(queue: torch.Tensor, written: int) -> torch.Tensor:
    """The entries of a circular queue that has had ``written`` rows written, oldest
    first (the unwritten slots left out)."""
    size = queue.shape[0]
    if written < size:
        return queue[:written]
    start = written % size
    return torch.cat([queue[start:], queue[:start]])


@register_loss("nnclr_loss")
class NNCLRLoss(nn.Module):
    """NNCLR loss with its support-set queue, one for all ranks (see the module docstring).

    Args:
        temperature: the softmax temperature ``T`` (> 0).
        queue_size: projections in the support set (the same set on every rank).
        embedding_dim: width of the projections and predictions.
    """

    #: the loss's name under LOSS, and the config key of each argument (for errors)
    loss_name: ClassVar[str] = "nnclr_loss"
    key_paths: ClassVar[dict[str, str]] = {
        "temperature": f"{_KEY}.temperature",
        "queue_size": f"{_KEY}.queue_size",
        "embedding_dim": f"{_KEY}.embedding_dim",
    }

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
            key = self.key_paths["temperature"]
            raise ConfigError(f"{key} must be a number > 0, got {temperature!r}.", key)
        self.temperature = float(temperature)
        self.queue_size = self._positive_int(queue_size, "queue_size")
        self.embedding_dim = self._positive_int(embedding_dim, "embedding_dim")
        # The same on every rank: saved with state_dict, broadcast from rank 0 at the start.
        self.register_buffer("queue", torch.zeros(self.queue_size, self.embedding_dim))
        #: projections written to the queue so far (the next slot is written % queue_size)
        self.register_buffer("written", torch.zeros((), dtype=torch.long))
        self.capture: ProjectionCapture | None = None

    @classmethod
    def _positive_int(cls, value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            key = cls.key_paths[name]
            raise ConfigError(f"{key} must be a positive integer, got {value!r}.", key)
        return value

    # ------------------------------------------------------------------ config
    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        """``embedding_dim`` from the head; a projector and a predictor of the same width
        (the support set's projections meet the predictions in one dot product).

        Raises:
            ConfigError: HEAD.PARAMS is not ``[projector, predictor]``, their output widths
                differ, or the transforms do not make 2 views.
        """
        infer_predictor_config(params, config, cls.loss_name, "NNCLR")

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> NNCLRLoss:
        """Build from ``LOSS.nnclr_loss`` (a key the constructor does not take is a
        ConfigError)."""
        return build_from_params(cls, params, _KEY)

    def bind_model(self, model: nn.Module) -> None:
        """Keep the projector's output of each forward (the predictor's input)."""
        if self.capture is not None:
            self.capture.remove()
        self.capture = ProjectionCapture(model)

    # ------------------------------------------------------------------ checkpoints
    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """As ``nn.Module.load_state_dict``; a state without the queue (a checkpoint of the
        per-rank queues, restored by :meth:`load_rank_state_dict`) or with a queue of
        another shape (a warning) keeps this loss's queue and count."""
        state = dict(state_dict)
        saved = state.get("queue")
        if saved is None or tuple(saved.shape) != tuple(self.queue.shape):
            if saved is not None:
                logger.warning(
                    "%s: the support set is not restored: saved shape %s, this run's %s "
                    "(queue_size or embedding_dim changed); it fills again.",
                    self.loss_name,
                    tuple(saved.shape),
                    tuple(self.queue.shape),
                )
            state["queue"], state["written"] = self.queue.clone(), self.written.clone()
        return super().load_state_dict(state, strict=strict, assign=assign)

    def load_rank_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a checkpoint of the per-rank queues (written before the support set was
        global): every rank's queue, gathered in rank order, each oldest entry first,
        is written into the global queue. Collective: every rank calls it (the
        checkpoint code does, when the checkpoint has one state per rank of this run)."""
        queue, written = state.get("queue"), state.get("written")
        if queue is None or written is None:
            return
        device = self.queue.device
        queues = gather_from_all(torch.as_tensor(queue).detach().to(device).float())
        counts = gather_from_all(torch.as_tensor(written).detach().to(device).reshape(1))
        per_rank = queues.shape[0] // counts.shape[0]
        if queues.shape[1] != self.embedding_dim:
            logger.warning(
                "%s: the per-rank support sets of the checkpoint are %d wide, this run's "
                "%d: not restored; the support set fills again.",
                self.loss_name,
                queues.shape[1],
                self.embedding_dim,
            )
            return
        rows = torch.cat(
            [
                oldest_first(queues[r * per_rank : (r + 1) * per_rank], int(count))
                for r, count in enumerate(counts.tolist())
            ]
        )
        with torch.no_grad():
            self.queue.zero_()
            self.written.zero_()
            self._write(rows)
        logger.info(
            "%s: support set restored from a checkpoint of %d per-rank queue(s): %d "
            "projections (rank order, oldest first) into the global queue of %d.",
            self.loss_name,
            counts.shape[0],
            rows.shape[0],
            self.queue_size,
        )

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
    def _write(self, keys: torch.Tensor) -> None:
        """Write ``keys`` over the oldest entries (circular), on this rank only."""
        n = int(keys.shape[0])
        keys = keys.detach().to(self.queue.dtype)
        skip = max(0, n - self.queue_size)  # more rows than slots: the last ones stay
        keys = keys[skip:]
        index = (self.written + skip + torch.arange(keys.shape[0], device=keys.device)) % (
            self.queue_size
        )
        self.queue.index_copy_(0, index, keys)
        self.written.add_(n)

    @torch.no_grad()
    def enqueue(self, z: torch.Tensor) -> None:
        """Write the normalised projections ``z`` of every rank (gathered in rank order,
        no gradient) over the oldest entries: the queue stays the same on every rank."""
        self._write(gather_from_all(z.detach()))

    # ------------------------------------------------------------------ loss
    def forward(self, output: Any, target: Any = None) -> torch.Tensor:
        """The symmetrised NNCLR loss of this rank's rows; ``target`` is unused. In
        training mode, the view-1 projections of every rank are enqueued afterwards.

        Args:
            output: the predictions ``(2 * B, D)``, view-major (or a list holding them).
            target: unused.
        """
        name = self.loss_name
        prediction = checked_prediction(
            output, name, self.embedding_dim, self.key_paths["embedding_dim"]
        )
        projection = captured_projection(self.capture, prediction, name)
        # fp32 similarities and softmax, also under a bf16/fp16 autocast
        with torch.autocast(device_type=prediction.device.type, enabled=False):
            p1, p2 = two_views(F.normalize(prediction.float(), dim=1), name)
            z1, z2 = two_views(F.normalize(projection.detach().float(), dim=1), name)
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


def _mlp_arguments(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """An ``mlp`` head's arguments with its defaults filled in (for comparing two)."""
    from vissl.models.heads.mlp import MLP

    defaults = {
        name: p.default
        for name, p in inspect.signature(MLP).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    out = {**defaults, **kwargs}
    if "dims" in out:
        out["dims"] = [int(d) for d in out["dims"]]
    return out


@register_loss("nnclr_info_nce_loss")
class NNCLRInfoNCELoss(NNCLRLoss):
    """:class:`NNCLRLoss` under the name and keys of VISSL's NNCLR (its pull request
    "NNCLR Implementation", facebookresearch/vissl#318, registered ``nnclr_info_nce_loss``;
    it was never merged into a VISSL release).

    Keys: ``temperature``; ``queue_size`` (the support set, one queue for all ranks there
    too); ``buffer_params.embedding_dim`` (inferred from the head), with
    ``buffer_params.world_size`` and ``effective_batch_size`` informational;
    ``prediction_head_params``, the arguments VISSL built its predictor ``mlp`` from
    inside the loss. Here the predictor is the last head of ``MODEL.HEAD.PARAMS``
    (``[projector, predictor]``), so ``prediction_head_params``, when set, must equal that
    head's arguments (a ConfigError says where to put them otherwise).

    The loss is this project's NNCLR: the queue holds view-1 projections only and is
    used once full (VISSL's pull request enqueued both views and started from random
    entries).
    """

    loss_name: ClassVar[str] = "nnclr_info_nce_loss"
    key_paths: ClassVar[dict[str, str]] = {
        "temperature": f"{_VISSL_KEY}.temperature",
        "queue_size": f"{_VISSL_KEY}.queue_size",
        "embedding_dim": f"{_VISSL_KEY}.buffer_params.embedding_dim",
    }
    _KEYS: ClassVar[tuple[str, ...]] = (
        "temperature",
        "queue_size",
        "buffer_params",
        "prediction_head_params",
    )
    _BUFFER_KEYS: ClassVar[tuple[str, ...]] = (
        "embedding_dim",
        "world_size",
        "effective_batch_size",
    )

    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        """``buffer_params.embedding_dim`` from the head, and ``prediction_head_params``
        checked against the predictor in ``MODEL.HEAD.PARAMS``.

        Raises:
            ConfigError: ``prediction_head_params`` is set and is not the last head's
                arguments, or what :meth:`NNCLRLoss.infer_config` refuses.
        """
        cls._check_keys(params)
        cls._check_prediction_head(params.get("prediction_head_params"), config)
        infer_predictor_config(
            params, config, cls.loss_name, "NNCLR", dim_key="buffer_params.embedding_dim"
        )

    @classmethod
    def _check_keys(cls, params: Mapping[str, Any]) -> None:
        unknown = sorted(set(params) - set(cls._KEYS))
        if unknown:
            raise ConfigError(
                f"{_VISSL_KEY} has no key(s) {unknown}; its keys are {sorted(cls._KEYS)}.",
                f"{_VISSL_KEY}.{unknown[0]}",
            )
        buffer_params = params.get("buffer_params") or {}
        if not isinstance(buffer_params, Mapping):
            raise ConfigError(
                f"{_VISSL_KEY}.buffer_params must be a mapping (embedding_dim, world_size, "
                f"effective_batch_size), got {buffer_params!r}.",
                f"{_VISSL_KEY}.buffer_params",
            )
        unknown = sorted(set(buffer_params) - set(cls._BUFFER_KEYS))
        if unknown:
            raise ConfigError(
                f"{_VISSL_KEY}.buffer_params has no key(s) {unknown}; its keys are "
                f"{sorted(cls._BUFFER_KEYS)}.",
                f"{_VISSL_KEY}.buffer_params.{unknown[0]}",
            )

    @staticmethod
    def _check_prediction_head(given: Any, config: Mapping[str, Any]) -> None:
        if not given:
            return
        key = f"{_VISSL_KEY}.prediction_head_params"
        if not isinstance(given, Mapping):
            raise ConfigError(
                f"{key} must be the predictor mlp's arguments, e.g. {{dims: [256, 4096, 256], "
                f"use_bn: True, use_relu: True}}; got {given!r}.",
                key,
            )
        given = dict(given)
        specs = _module_specs((config.get("MODEL") or {}).get("HEAD", {}).get("PARAMS") or [])
        last = specs[-1] if specs and len(specs) >= 2 else None
        if last is not None and last[0] in ("mlp", "mlp_fsdp"):
            if _mlp_arguments(last[1]) == _mlp_arguments(given):
                return
        raise ConfigError(
            f"{key}: VISSL's NNCLR loss built its predictor from these arguments; vissl's "
            f"predictor is the last head of {_HEAD_KEY} ([projector, predictor]), which "
            f'is {list(last) if last else "missing"}. Put ["mlp", {given}] last in '
            f"{_HEAD_KEY}, after the projector, and leave {key} out (or equal to it).",
            key,
        )

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> NNCLRInfoNCELoss:
        """Build from ``LOSS.nnclr_info_nce_loss`` (VISSL's keys)."""
        cls._check_keys(params)
        buffer_params = params.get("buffer_params") or {}
        return cls(
            temperature=params.get("temperature", 0.1),
            queue_size=params.get("queue_size", 98304),
            embedding_dim=buffer_params.get("embedding_dim", 256),
        )

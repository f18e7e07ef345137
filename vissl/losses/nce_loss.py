"""``nce_loss_with_memory``: NPID, NPID++ and PIRL's loss against a memory bank.

NPID (Wu et al., *Unsupervised Feature Learning via Non-Parametric Instance
Discrimination*, CVPR 2018) keeps a **memory bank** ``M`` with one L2-normalised embedding
per training sample. A sample ``i`` with (normalised) embedding ``v`` is scored against its
own entry ``M[i]`` (the positive) and ``K`` entries drawn uniformly from the bank (the
noise samples, ``num_negatives``)::

    P(i | v) = exp(M[i] . v / T) / Z                      (the paper's eq. 4, Z estimated)

    Z = N * mean over the first batch of exp(M[j] . v / T)  (once, then fixed: eq. 6)

``loss_type: nce`` is the paper's noise-contrastive estimation (eq. 5-7) with a uniform
noise distribution ``P_n = 1/N``::

    h(x)  = x / (x + K / N)
    loss  = - mean_rows [ log h(P(i | v)) + sum_{k=1..K} log(1 - h(P(j_k | v))) ]

``loss_type: cross_entropy`` is the InfoNCE form PIRL uses (Misra & van der Maaten,
*Self-Supervised Learning of Pretext-Invariant Representations*, CVPR 2020): the
cross-entropy of ``[M[i] . v, M[j_1] . v, ..., M[j_K] . v] / T`` with the positive first.

After the step's scores, the bank is updated with momentum (the paper's proximal update):
``M[i] <- normalise(m * M[i] + (1 - m) * v)``.

**Several outputs** (PIRL: ``[patch embedding, image embedding]``): each output is scored
against the same bank and the terms are summed with ``loss_weights``. With
``memory_params.update_mem_on_forward: False`` only the output ``update_mem_with_emb_index``
updates the bank; with ``True`` every output does, in order. All outputs are scored against
the bank as it was before the step's updates (VISSL scores an output after the updates of
the outputs before it; the two agree whenever the updating output is the last one, as in
VISSL's PIRL and NPID configs).

**Across ranks.** The bank is replicated: every rank holds all ``N`` entries. It starts
equal on every rank (the task broadcasts the loss's buffers from rank 0), and at each step
the embeddings and indices of every rank are gathered (rank order) and every rank applies
the same update, so the banks stay equal and each sample's entry is updated once, with the
embedding of the rank that saw it. An index that appears more than once in the gathered
batch (a padded last batch) is updated once, with its first occurrence. The noise samples
are drawn per rank from the torch generator of the loss's device (saved and restored by the
checkpoint, so resumed runs draw the same ones). ``Z`` is estimated once, at the first step,
from the mean over the global batch (an all-reduce), and saved with the bank.

**Checkpoints.** The bank and ``Z`` are buffers of the loss: one copy (they are equal on
every rank) in the checkpoint's ``loss`` entry, restored exactly.

``ignore_index``: rows whose target equals it are left out of the loss and of the update
(without a host read: they get weight 0).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import nn

from vissl.config.params import (
    Finite,
    IntAtLeast,
    NonNegative,
    Note,
    OneOf,
    Positive,
    UnitOpen,
    parse,
)
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.utils.distributed import all_reduce_mean, get_world_size

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.nce_loss_with_memory"
LOSS_TYPES = ("nce", "cross_entropy")
SAMPLING_TYPES = ("random", "debug")


@dataclass(kw_only=True, frozen=True)
class NCEMemoryParams:
    """``memory_params``: the bank."""

    #: entries of the bank (VISSL's key; follows num_train_samples)
    memory_size: int = -1
    embedding_dim: Annotated[int, IntAtLeast(1)] = 128
    momentum: Annotated[float, Finite, UnitOpen, Note("1 would never write the bank")] = 0.5
    norm_init: bool = True
    update_mem_on_forward: bool = False


@dataclass(kw_only=True, frozen=True)
class NCESamplingParams:
    """``negative_sampling_params``: the noise samples."""

    num_negatives: Annotated[int, IntAtLeast(1)] = 16000
    type: Annotated[str, OneOf(*SAMPLING_TYPES)] = "random"


@dataclass(kw_only=True, frozen=True)
class NCEParams:
    """``config.LOSS.nce_loss_with_memory``."""

    #: the bank's entries; -1 (or null): the task sets it from the training data set
    num_train_samples: int | None = -1
    ignore_index: int = -1
    norm_embedding: bool = True
    temperature: Annotated[float, Finite, Positive] = 0.07
    #: ``Z``; negative: estimated at the first step
    norm_constant: Annotated[float, Finite] = -1.0
    loss_type: Annotated[str, OneOf(*LOSS_TYPES)] = "nce"
    #: one weight per output; empty: 1 each
    loss_weights: list[Annotated[float, Finite, NonNegative]] | None = None
    update_mem_with_emb_index: Annotated[int, IntAtLeast(0)] = 0
    memory_params: NCEMemoryParams = field(default_factory=NCEMemoryParams)
    negative_sampling_params: NCESamplingParams = field(default_factory=NCESamplingParams)

    def check(self, key_path: str) -> None:
        if self.norm_constant == 0:
            raise ConfigError(
                f"{key_path}.norm_constant must be > 0, or negative to estimate it at the "
                "first step; got 0.",
                f"{key_path}.norm_constant",
            )


def nce_criterion(probs: torch.Tensor, num_items: int, weights: torch.Tensor) -> torch.Tensor:
    """NPID's NCE loss (eq. 7) of ``probs`` ``(B, 1 + K)``: the model's probability of the
    positive (column 0) and of ``K`` noise samples, with noise probability ``1 / num_items``.
    Rows are weighted by ``weights`` (1 or 0) and averaged over the weighted rows."""
    k = probs.shape[1] - 1
    noise = k / float(num_items)
    eps = torch.finfo(probs.dtype).eps
    log_pos = torch.log(probs[:, 0] / (probs[:, 0] + noise + eps))
    log_neg = torch.log(noise / (probs[:, 1:] + noise + eps)).sum(dim=1)
    per_row = -(log_pos + log_neg)
    return (per_row * weights).sum() / weights.sum().clamp(min=1.0)


def first_valid_occurrence(index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """For each position of ``index`` (1-D), the first position holding the same index
    among the ``valid`` ones; the position itself when there is none."""
    same = (index.unsqueeze(1) == index.unsqueeze(0)) & valid.unsqueeze(0)
    own = torch.arange(index.shape[0], device=index.device)
    return torch.where(same.any(dim=1), same.int().argmax(dim=1), own)


@register_loss("nce_loss_with_memory")
class NCELossWithMemory(nn.Module):
    """NCE / InfoNCE against a memory bank of every training sample (module docstring).

    Args:
        num_train_samples: entries of the bank (the training set's size; the task sets it
            from the data set when the config leaves it at -1).
        embedding_dim: width of the embeddings.
        temperature: ``T`` (> 0).
        num_negatives: noise samples ``K`` per row.
        momentum: the bank's update momentum ``m`` in ``[0, 1)``.
        loss_type: ``nce`` (NPID) or ``cross_entropy`` (InfoNCE, PIRL).
        norm_embedding: L2-normalise the outputs before scoring and updating.
        norm_constant: ``Z``; a negative value estimates it at the first step.
        loss_weights: one weight per output (defaults to 1 each).
        update_mem_on_forward: every output updates the bank (else only
            ``update_mem_with_emb_index``).
        update_mem_with_emb_index: the output that updates the bank.
        norm_init: normalise the bank's random initial entries.
        ignore_index: target value of rows to leave out.
        sampling: ``random`` (uniform; ``debug`` is accepted as its VISSL alias).
    """

    memory: torch.Tensor
    norm_constant: torch.Tensor

    Params = NCEParams

    def __init__(
        self,
        num_train_samples: int,
        embedding_dim: int = NCEMemoryParams.embedding_dim,
        temperature: float = NCEParams.temperature,
        num_negatives: int = NCESamplingParams.num_negatives,
        momentum: float = NCEMemoryParams.momentum,
        loss_type: str = NCEParams.loss_type,
        norm_embedding: bool = NCEParams.norm_embedding,
        norm_constant: float = NCEParams.norm_constant,
        loss_weights: Sequence[float] | None = NCEParams.loss_weights,
        update_mem_on_forward: bool = NCEMemoryParams.update_mem_on_forward,
        update_mem_with_emb_index: int = NCEParams.update_mem_with_emb_index,
        norm_init: bool = NCEMemoryParams.norm_init,
        ignore_index: int = NCEParams.ignore_index,
        sampling: str = NCESamplingParams.type,
    ) -> None:
        super().__init__()
        p = parse(
            NCEParams,
            {
                "num_train_samples": num_train_samples,
                "temperature": temperature,
                "loss_type": loss_type,
                "norm_embedding": norm_embedding,
                "norm_constant": norm_constant,
                "loss_weights": None if loss_weights is None else list(loss_weights),
                "update_mem_with_emb_index": update_mem_with_emb_index,
                "ignore_index": ignore_index,
                "memory_params": {
                    "embedding_dim": embedding_dim,
                    "momentum": momentum,
                    "norm_init": norm_init,
                    "update_mem_on_forward": update_mem_on_forward,
                },
                "negative_sampling_params": {"num_negatives": num_negatives, "type": sampling},
            },
            _KEY,
        )
        if not isinstance(p.num_train_samples, int) or p.num_train_samples < 1:
            raise ConfigError(
                f"{_KEY}.num_train_samples must be an integer >= 1, got {num_train_samples!r}.",
                f"{_KEY}.num_train_samples",
            )
        self.num_items = p.num_train_samples
        self.embedding_dim = p.memory_params.embedding_dim
        self.temperature = p.temperature
        self.num_negatives = p.negative_sampling_params.num_negatives
        self.momentum = p.memory_params.momentum
        self.loss_type = p.loss_type
        self.norm_embedding = p.norm_embedding
        self.loss_weights = p.loss_weights
        self.update_mem_on_forward = p.memory_params.update_mem_on_forward
        self.update_index = p.update_mem_with_emb_index
        self.ignore_index = p.ignore_index
        # NPID's initialisation: uniform in [-s, s], s = 1 / sqrt(d / 3), then normalised.
        # Drawn from a fixed generator: the same bank for every rank and run (the task also
        # broadcasts rank 0's buffers).
        generator = torch.Generator().manual_seed(0)
        stdv = 1.0 / math.sqrt(self.embedding_dim / 3.0)
        memory = torch.rand(self.num_items, self.embedding_dim, generator=generator)
        memory = memory.mul_(2 * stdv).sub_(stdv)
        if p.memory_params.norm_init:
            memory = F.normalize(memory, dim=1)
        self.register_buffer("memory", memory)
        self.register_buffer("norm_constant", torch.tensor(p.norm_constant))
        # whether Z is known (read from the buffer at the first step: one host read per run)
        self._z_known: bool | None = None

    # ------------------------------------------------------------------ config
    @classmethod
    def derive(cls, params: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with ``memory_params.memory_size`` following ``num_train_samples``
        (as in VISSL), as a new mapping.

        ``num_train_samples`` itself is the training data set's size, known to the task
        (it builds the loss with it when the config leaves it at -1)."""
        out = dict(params)
        memory = out.get("memory_params")
        num = out.get("num_train_samples", -1)
        if isinstance(memory, Mapping) and isinstance(num, int) and num > 0:
            out["memory_params"] = {**memory, "memory_size": num}
        return out

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> NCELossWithMemory:
        p = parse(NCEParams, params, _KEY)
        memory, sampling = p.memory_params, p.negative_sampling_params
        num = p.num_train_samples
        if num is None or num <= 0:
            if memory.memory_size > 0:
                num = memory.memory_size
            else:
                raise ConfigError(
                    f"{_KEY}.num_train_samples is not set: the memory bank needs one entry per "
                    "training sample. It is set from the training data when the loss is built "
                    "by a training run; set it (or memory_params.memory_size) to the data "
                    "set's size when building the loss yourself.",
                    f"{_KEY}.num_train_samples",
                )
        return cls(
            num_train_samples=num,
            embedding_dim=memory.embedding_dim,
            temperature=p.temperature,
            num_negatives=sampling.num_negatives,
            momentum=memory.momentum,
            loss_type=p.loss_type,
            norm_embedding=p.norm_embedding,
            norm_constant=p.norm_constant,
            loss_weights=p.loss_weights or None,
            update_mem_on_forward=memory.update_mem_on_forward,
            update_mem_with_emb_index=p.update_mem_with_emb_index,
            norm_init=memory.norm_init,
            ignore_index=p.ignore_index,
            sampling=sampling.type,
        )

    # ------------------------------------------------------------------ pieces
    def draw_negatives(self, rows: int, device: torch.device) -> torch.Tensor:
        """``(rows, K)`` uniform indices into the bank (the default generator of ``device``)."""
        return torch.randint(0, self.num_items, (rows, self.num_negatives), device=device)

    def scores(self, v: torch.Tensor, index: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        """``(B, 1 + K)`` logits ``M[j] . v / T``: the positive ``index`` first."""
        ids = torch.cat([index.unsqueeze(1), negatives], dim=1)
        bank = self.memory.index_select(0, ids.reshape(-1)).view(*ids.shape, -1)
        return torch.einsum("bkd,bd->bk", bank, v) / self.temperature

    def _ensure_norm_constant(self, logits: torch.Tensor, weights: torch.Tensor) -> None:
        """Estimate ``Z = N * mean exp(logits)`` over the global batch at the first step."""
        if self._z_known is None:
            self._z_known = bool(self.norm_constant > 0)
        if self._z_known:
            return
        with torch.no_grad():
            exp = torch.exp(logits.detach())
            stats = torch.stack([(exp.mean(dim=1) * weights).sum(), weights.sum()]).float()
            if get_world_size() > 1:
                stats = all_reduce_mean(stats)
            mean = stats[0] / stats[1].clamp(min=1.0)
            self.norm_constant.copy_(mean * self.num_items)
        self._z_known = True
        logger.info("nce_loss_with_memory: normalisation constant Z estimated at the first step")

    @torch.no_grad()
    def update_memory(self, v: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> None:
        """``M[i] <- normalise(m M[i] + (1 - m) v)`` for the rows of every rank."""
        v = v.detach().to(self.memory.dtype)
        if get_world_size() > 1:
            v = _gather_no_grad(v)
            index = _gather_no_grad(index)
            weights = _gather_no_grad(weights)
        valid = weights > 0
        old = self.memory.index_select(0, index)
        new = F.normalize(old * self.momentum + v * (1.0 - self.momentum), dim=1)
        new = torch.where(valid.unsqueeze(1), new, old)
        # An index held by several rows (a padded last batch; ignored rows point at entry
        # 0): every row writes the value of its index's first valid row, so the writes
        # agree whatever their order on the device.
        new = new.index_select(0, first_valid_occurrence(index, valid))
        self.memory.index_copy_(0, index, new)

    # ------------------------------------------------------------------ forward
    def forward(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        """The weighted sum over outputs of the NCE (or InfoNCE) loss against the bank.

        Args:
            output: ``(B, D)`` embeddings, or a list of them (one per head).
            target: ``(B,)`` sample indices (``DATA.TRAIN.LABEL_TYPE: sample_index``).
        """
        outputs = [output] if isinstance(output, torch.Tensor) else list(output)
        if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
            raise TypeError(
                "nce_loss_with_memory expects the model output to be a tensor or a list of "
                f"tensors, got {type(output).__name__}."
            )
        weights_cfg = self.loss_weights or [1.0] * len(outputs)
        if len(weights_cfg) != len(outputs):
            raise ConfigError(
                f"{_KEY}.loss_weights has {len(weights_cfg)} entries but the model has "
                f"{len(outputs)} outputs: give one weight per head output.",
                f"{_KEY}.loss_weights",
            )
        if not self.update_mem_on_forward and self.update_index >= len(outputs):
            raise ConfigError(
                f"{_KEY}.update_mem_with_emb_index is {self.update_index} but the model has "
                f"{len(outputs)} outputs.",
                f"{_KEY}.update_mem_with_emb_index",
            )
        # fp32 scores, exponentials and update, also under a bf16/fp16 autocast (exp(s / T)
        # at T = 0.07 in bf16 is off by several percent)
        with torch.autocast(device_type=outputs[0].device.type, enabled=False):
            return self._forward(outputs, target, weights_cfg)

    def _forward(
        self, outputs: list[torch.Tensor], target: torch.Tensor, weights_cfg: list[float]
    ) -> torch.Tensor:
        index = _as_index(target, outputs[0].shape[0])
        valid = (index != self.ignore_index).to(self.memory.dtype)
        index = torch.where(index == self.ignore_index, torch.zeros_like(index), index)
        negatives = self.draw_negatives(index.shape[0], index.device)
        embeddings = []
        total = outputs[0].new_zeros((), dtype=self.memory.dtype)
        for weight, out in zip(weights_cfg, outputs, strict=True):
            if out.ndim != 2 or out.shape[1] != self.embedding_dim:
                raise ValueError(
                    f"nce_loss_with_memory: an output of shape {tuple(out.shape)} does not "
                    f"match the bank's (batch, {self.embedding_dim}) (set "
                    f"{_KEY}.memory_params.embedding_dim to the head's output width)."
                )
            v = out.to(self.memory.dtype)
            if self.norm_embedding:
                v = F.normalize(v, dim=1)
            embeddings.append(v)
            logits = self.scores(v, index, negatives)
            if self.loss_type == "nce":
                self._ensure_norm_constant(logits, valid)
                probs = torch.exp(logits) / self.norm_constant
                term = nce_criterion(probs, self.num_items, valid)
            else:
                per_row = F.cross_entropy(logits, torch.zeros_like(index), reduction="none")
                term = (per_row * valid).sum() / valid.sum().clamp(min=1.0)
            total = total + weight * term
        for i, v in enumerate(embeddings):
            if self.update_mem_on_forward or i == self.update_index:
                self.update_memory(v, index, valid)
        return total

    def extra_repr(self) -> str:
        return (
            f"num_train_samples={self.num_items}, embedding_dim={self.embedding_dim}, "
            f"loss_type={self.loss_type}, temperature={self.temperature}, "
            f"num_negatives={self.num_negatives}, momentum={self.momentum}"
        )


def _as_index(target: Any, rows: int) -> torch.Tensor:
    if not isinstance(target, torch.Tensor):
        raise TypeError(
            "nce_loss_with_memory needs the sample indices as the target: set "
            "config.DATA.TRAIN.LABEL_TYPE to sample_index."
        )
    index = target.reshape(-1).long()
    if index.shape[0] != rows:
        raise ValueError(
            f"nce_loss_with_memory: {index.shape[0]} targets for {rows} embeddings; the "
            "target must hold one sample index per row (config.DATA.TRAIN.LABEL_TYPE: "
            "sample_index)."
        )
    return index


def _gather_no_grad(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` of every rank concatenated in rank order (no gradient)."""
    import torch.distributed as dist

    parts = [torch.empty_like(tensor) for _ in range(get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=0)

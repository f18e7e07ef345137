"""``simclr_info_nce_loss``: SimCLR's NT-Xent (normalised temperature-scaled cross entropy).

Layout (as produced by the ``simclr_collator``): each rank's batch holds ``num_pos`` views
of its ``B`` samples, view-major: ``[view0 of samples 0..B-1; view1 of samples 0..B-1]``.
The embeddings of every rank are gathered (with gradients) into one
``(world_size * num_pos * B, D)`` buffer, rank-major. For each local row the positives are
the other views of the same sample; the negatives are every other row of the buffer
except the views of that sample. The loss is the mean over local rows of
``-log(sum(exp(pos / T)) / (sum(exp(pos / T)) + sum(exp(neg / T))))``, as in VISSL,
computed with ``logsumexp`` so that small temperatures do not overflow.

The world size and per-rank batch size are taken from the input at forward time (VISSL
computes them from ``buffer_params``, which its config inference fills in); the masks are
cached per layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from torch import nn

from vissl.config.params import IntAtLeast, Positive, as_dict, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.utils.distributed import gather_from_all, get_rank, get_world_size

_KEY = "config.LOSS.simclr_info_nce_loss"


def simclr_masks(
    local_batch: int, world_size: int, rank: int, num_pos: int = 2, device: Any = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positive and "counted" (positive or negative) masks of one rank's rows.

    Args:
        local_batch: rows on this rank (``num_pos * B``).
        world_size: number of ranks whose rows are gathered.
        rank: this rank.
        num_pos: views per sample.
        device: where the masks are created.

    Returns:
        ``(pos_mask, keep_mask)``, both ``(local_batch, world_size * local_batch)`` bool:
        ``pos_mask`` marks the other views of the row's sample, ``keep_mask`` marks every
        column except the row itself (positives and negatives).
    """
    samples = local_batch // num_pos
    rows = torch.arange(local_batch, device=device)
    sample_of_row = rows % samples
    view_of_row = rows // samples
    cols = torch.arange(world_size * local_batch, device=device)
    col_rank = cols // local_batch
    col_sample = (cols % local_batch) % samples
    col_view = (cols % local_batch) // samples
    same_sample = (col_rank[None, :] == rank) & (col_sample[None, :] == sample_of_row[:, None])
    same_view = col_view[None, :] == view_of_row[:, None]
    pos_mask = same_sample & ~same_view
    keep_mask = ~(same_sample & same_view)
    return pos_mask, keep_mask


class SimclrInfoNCECriterion(nn.Module):
    """NT-Xent over L2-normalised embeddings gathered from every rank.

    Args:
        temperature: the similarity temperature ``T``.
        embedding_dim: expected embedding width, checked at forward time (``None``: any).
        num_pos: views per sample (2 for SimCLR).
    """

    def __init__(self, temperature: float, embedding_dim: int | None = None, num_pos: int = 2):
        super().__init__()
        self.temperature = float(temperature)
        self.embedding_dim = embedding_dim
        self.num_pos = int(num_pos)
        self._masks: dict[tuple[int, int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def _get_masks(
        self, local_batch: int, world_size: int, rank: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key = (local_batch, world_size, rank, str(device))
        masks = self._masks.get(key)
        if masks is None:
            masks = simclr_masks(local_batch, world_size, rank, self.num_pos, device)
            self._masks[key] = masks
        return masks

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        """Loss of this rank's rows; ``embedding`` is ``(num_pos * B, D)``, already normalised."""
        if embedding.ndim != 2:
            raise ValueError(
                f"simclr_info_nce_loss expects (num_pos * B, D) embeddings, got shape "
                f"{tuple(embedding.shape)}."
            )
        local_batch, dim = embedding.shape
        if self.embedding_dim is not None and dim != self.embedding_dim:
            raise ConfigError(
                f"{_KEY}.buffer_params.embedding_dim is {self.embedding_dim} but the model "
                f"outputs {dim}-dimensional embeddings; set it to {dim} (the last of the "
                "head's dims).",
                f"{_KEY}.buffer_params.embedding_dim",
            )
        if local_batch == 0 or local_batch % self.num_pos != 0:
            raise ValueError(
                f"simclr_info_nce_loss: the batch of {local_batch} embeddings is not "
                f"{self.num_pos} views of each sample; use the simclr_collator."
            )
        world_size = get_world_size()
        buffer = gather_from_all(embedding)
        pos_mask, keep_mask = self._get_masks(local_batch, world_size, get_rank(), embedding.device)
        logits = torch.mm(embedding, buffer.t()).float() / self.temperature
        neg_inf = torch.finfo(logits.dtype).min
        log_pos = torch.logsumexp(logits.masked_fill(~pos_mask, neg_inf), dim=1)
        log_all = torch.logsumexp(logits.masked_fill(~keep_mask, neg_inf), dim=1)
        return (log_all - log_pos).mean()

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, num_pos={self.num_pos}"


@dataclass(kw_only=True, frozen=True)
class BufferParams:
    """VISSL's ``buffer_params``: ``embedding_dim`` is checked against the model's output
    at forward time (``None``: any); ``world_size`` and ``effective_batch_size`` are
    informational (the actual ones are read at forward time)."""

    embedding_dim: Annotated[int, IntAtLeast(1)] | None = None
    world_size: int | None = None
    effective_batch_size: int | None = None


@dataclass(kw_only=True, frozen=True)
class SimclrParams:
    """``config.LOSS.simclr_info_nce_loss``."""

    temperature: Annotated[float, Positive] = 0.1
    buffer_params: BufferParams = field(default_factory=BufferParams)


@register_loss("simclr_info_nce_loss")
class SimclrInfoNCELoss(nn.Module):
    """SimCLR loss: normalise the head output, then :class:`SimclrInfoNCECriterion`.

    Args:
        temperature: the similarity temperature.
        embedding_dim: expected embedding width (``buffer_params.embedding_dim``).
        world_size: informational (VISSL's ``buffer_params.world_size``); the actual world
            size is read at forward time.
        effective_batch_size: informational, like ``world_size``.
    """

    Params = SimclrParams

    def __init__(
        self,
        temperature: float = SimclrParams.temperature,
        embedding_dim: int | None = BufferParams.embedding_dim,
        world_size: int | None = BufferParams.world_size,
        effective_batch_size: int | None = BufferParams.effective_batch_size,
    ) -> None:
        super().__init__()
        buffer = {
            "embedding_dim": embedding_dim,
            "world_size": world_size,
            "effective_batch_size": effective_batch_size,
        }
        p = parse(SimclrParams, {"temperature": temperature, "buffer_params": buffer}, _KEY)
        self.temperature = p.temperature
        self.configured_world_size = world_size
        self.configured_effective_batch_size = effective_batch_size
        self.info_criterion = SimclrInfoNCECriterion(self.temperature, embedding_dim)

    @classmethod
    def from_config(cls, loss_config: Mapping[str, Any]) -> SimclrInfoNCELoss:
        """Build from ``LOSS.simclr_info_nce_loss`` (``temperature``, ``buffer_params``)."""
        p = parse(SimclrParams, loss_config, _KEY)
        return cls(temperature=p.temperature, **as_dict(p.buffer_params))

    def forward(
        self, output: torch.Tensor | Sequence[torch.Tensor], target: Any = None
    ) -> torch.Tensor:
        """NT-Xent of this rank's embeddings; ``target`` is ignored.

        Args:
            output: ``(2 * B, D)`` head output (or a list holding just that tensor).
            target: unused (SimCLR is self-supervised).
        """
        if not isinstance(output, torch.Tensor):
            outputs = list(output)
            if len(outputs) != 1:
                raise ValueError(
                    f"simclr_info_nce_loss expects one output tensor, got {len(outputs)}."
                )
            output = outputs[0]
        normalized = F.normalize(output, dim=1, p=2)
        return self.info_criterion(normalized)

"""``multicrop_simclr_info_nce_loss``: SimCLR's NT-Xent over several crops per sample.

Layout (as produced by ``ImgPilToMultiCrop`` + ``multicrop_collator``): each rank's batch
holds ``K = num_crops`` crops of its ``B`` samples, crop-major: row ``k * B + i`` is crop
``k`` of sample ``i``. The first 2 crops are the large ones, the other ``K - 2`` the small
ones. The L2-normalised embeddings of every rank are gathered (with gradients) into one
``(world_size * K * B, D)`` buffer, rank-major.

For a local sample ``i``, the *pairs* are the ordered crop pairs ``(k, j)``, ``k != j``,
that involve at least one large crop: a large crop is paired with every other crop, a
small crop with the 2 large crops only (small-small pairs are left out). Each sample has
``P = K(K-1) - (K-2)(K-3) = 4K - 6`` pairs. Each pair is one NT-Xent term with anchor
``a = z[k, i]`` and positive ``p = z[j, i]``::

    l(i, k, j) = -log( exp(a.p / T) / (exp(a.p / T) + sum_{n in N(i)} exp(a.n / T)) )

where the negatives ``N(i)`` are every row of the gathered buffer that is not a crop of
sample ``i``: every crop of every other sample, of **every rank**. The loss of a rank is
the mean of ``l`` over its ``B * P`` pairs. With ``K = 2`` this is exactly
``simclr_info_nce_loss`` (one pair per row, same negatives), on any number of processes.

Difference from VISSL: VISSL's ``MultiCropSimclrInfoNCECriterion`` zeroes the negative
mask outside the rank's own block, so on several processes the other ranks' embeddings are
gathered but never used as negatives and the loss is not SimCLR's. Here every rank's
embeddings are negatives, as in ``simclr_info_nce_loss``.

The terms are computed with ``logsumexp`` / ``logaddexp`` so that small temperatures do
not overflow; the masks are cached per layout.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from vissl.config.params import IntAtLeast, Note, Positive, as_dict, parse
from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.config_inference import head_output_dim
from vissl.losses.simclr_info_nce_loss import BufferParams
from vissl.utils.distributed import gather_from_all, get_rank, get_world_size

logger = logging.getLogger(__name__)

_KEY = "config.LOSS.multicrop_simclr_info_nce_loss"
NUM_LARGE_CROPS = 2


def num_pairs_per_sample(num_crops: int) -> int:
    """Ordered crop pairs of one sample that involve a large crop (``4K - 6``)."""
    small = max(num_crops - NUM_LARGE_CROPS, 0)
    return num_crops * (num_crops - 1) - small * (small - 1)


def multicrop_simclr_masks(
    num_samples: int, num_crops: int, world_size: int, rank: int, device: Any = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Negatives, positive columns and pair weights of one rank's rows.

    Args:
        num_samples: samples ``B`` on this rank.
        num_crops: crops ``K`` per sample (the first 2 are the large ones).
        world_size: number of ranks whose rows are gathered.
        rank: this rank.
        device: where the masks are created.

    Returns:
        ``(neg_mask, pos_cols, pair_weight)``: ``neg_mask`` is ``(K*B, W*K*B)`` bool, the
        columns that are not a crop of the row's sample; ``pos_cols`` is ``(K*B, K)``
        long, the gathered column of crop ``j`` of the row's sample; ``pair_weight`` is
        ``(K*B, K)`` float, ``1 / (B * P)`` on the pairs that count and 0 elsewhere
        (the row's own crop, small-small pairs).
    """
    local = num_crops * num_samples
    rows = torch.arange(local, device=device)
    sample_of_row = rows % num_samples
    crop_of_row = rows // num_samples
    cols = torch.arange(world_size * local, device=device)
    col_rank = cols // local
    col_sample = (cols % local) % num_samples
    same_sample = (col_rank[None, :] == rank) & (col_sample[None, :] == sample_of_row[:, None])
    neg_mask = ~same_sample
    crops = torch.arange(num_crops, device=device)
    pos_cols = rank * local + crops[None, :] * num_samples + sample_of_row[:, None]
    counted = (crops[None, :] != crop_of_row[:, None]) & (
        (crops[None, :] < NUM_LARGE_CROPS) | (crop_of_row[:, None] < NUM_LARGE_CROPS)
    )
    pair_weight = counted.float() / float(num_samples * num_pairs_per_sample(num_crops))
    return neg_mask, pos_cols, pair_weight


class MultiCropSimclrInfoNCECriterion(nn.Module):
    """Multi-crop NT-Xent over L2-normalised embeddings gathered from every rank.

    Args:
        temperature: the similarity temperature ``T``.
        num_crops: crops ``K`` per sample (``>= 2``; the first 2 are the large ones).
        embedding_dim: expected embedding width, checked at forward time (``None``: any).
    """

    def __init__(self, temperature: float, num_crops: int, embedding_dim: int | None = None):
        super().__init__()
        self.temperature = float(temperature)
        self.num_crops = int(num_crops)
        self.embedding_dim = embedding_dim
        self._masks: dict[
            tuple[int, int, int, str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]
        ] = {}

    def _get_masks(
        self, num_samples: int, world_size: int, rank: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        key = (num_samples, world_size, rank, str(device))
        masks = self._masks.get(key)
        if masks is None:
            masks = multicrop_simclr_masks(num_samples, self.num_crops, world_size, rank, device)
            self._masks[key] = masks
        return masks

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        """Loss of this rank's pairs; ``embedding`` is ``(K * B, D)``, already normalised."""
        if embedding.ndim != 2:
            raise ValueError(
                "multicrop_simclr_info_nce_loss expects (num_crops * B, D) embeddings, got "
                f"shape {tuple(embedding.shape)}."
            )
        rows, dim = embedding.shape
        if self.embedding_dim is not None and dim != self.embedding_dim:
            raise ConfigError(
                f"{_KEY}.buffer_params.embedding_dim is {self.embedding_dim} but the model "
                f"outputs {dim}-dimensional embeddings; set it to {dim} (the last of the "
                "head's dims).",
                f"{_KEY}.buffer_params.embedding_dim",
            )
        if rows == 0 or rows % self.num_crops != 0:
            raise ConfigError(
                f"{_KEY}: the batch of {rows} embeddings is not num_crops={self.num_crops} "
                "crops of each sample. Set num_crops to the ImgPilToMultiCrop "
                "total_num_crops of config.DATA.TRAIN.TRANSFORMS (or leave it to be "
                "inferred) and use COLLATE_FUNCTION: multicrop_collator.",
                f"{_KEY}.num_crops",
            )
        world_size = get_world_size()
        buffer = gather_from_all(embedding)
        neg_mask, pos_cols, pair_weight = self._get_masks(
            rows // self.num_crops, world_size, get_rank(), embedding.device
        )
        logits = torch.mm(embedding, buffer.t()).float() / self.temperature
        neg_inf = torch.finfo(logits.dtype).min
        log_neg = torch.logsumexp(logits.masked_fill(~neg_mask, neg_inf), dim=1, keepdim=True)
        pos = logits.gather(1, pos_cols)
        terms = torch.logaddexp(pos, log_neg) - pos
        return (terms * pair_weight).sum()

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, num_crops={self.num_crops}"


def _multicrop_total(config: Mapping[str, Any]) -> int | None:
    """``total_num_crops`` of the ImgPilToMultiCrop transform of DATA.TRAIN, if any."""
    transforms = ((config.get("DATA") or {}).get("TRAIN") or {}).get("TRANSFORMS") or []
    for transform in transforms:
        if isinstance(transform, Mapping) and transform.get("name") == "ImgPilToMultiCrop":
            total = transform.get("total_num_crops")
            if total is None:
                total = sum(transform.get("num_crops") or [])
            return int(total)
    return None


@dataclass(kw_only=True, frozen=True)
class MultiCropSimclrParams:
    """``config.LOSS.multicrop_simclr_info_nce_loss``."""

    temperature: Annotated[float, Positive] = 0.1
    num_crops: Annotated[int, IntAtLeast(2), Note("2 large crops, then the small ones")] = 2
    buffer_params: BufferParams = field(default_factory=BufferParams)


@register_loss("multicrop_simclr_info_nce_loss")
class MultiCropSimclrInfoNCELoss(nn.Module):
    """Multi-crop SimCLR loss: normalise the head output, then the criterion.

    Args:
        temperature: the similarity temperature.
        num_crops: crops per sample (the ImgPilToMultiCrop ``total_num_crops``).
        embedding_dim: expected embedding width (``buffer_params.embedding_dim``).
        world_size: informational (VISSL's ``buffer_params.world_size``); the actual world
            size is read at forward time.
        effective_batch_size: informational (rows of the gathered buffer).
    """

    Params = MultiCropSimclrParams

    def __init__(
        self,
        temperature: float = MultiCropSimclrParams.temperature,
        num_crops: int = MultiCropSimclrParams.num_crops,
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
        p = parse(
            MultiCropSimclrParams,
            {"temperature": temperature, "num_crops": num_crops, "buffer_params": buffer},
            _KEY,
        )
        self.temperature = p.temperature
        self.num_crops = p.num_crops
        self.configured_world_size = world_size
        self.configured_effective_batch_size = effective_batch_size
        self.info_criterion = MultiCropSimclrInfoNCECriterion(
            self.temperature, p.num_crops, embedding_dim
        )

    @classmethod
    def derive(cls, params: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with ``num_crops`` and ``buffer_params`` filled from the rest of the
        config (a new mapping; neither argument is changed).

        ``num_crops`` comes from the ImgPilToMultiCrop ``total_num_crops`` of
        DATA.TRAIN.TRANSFORMS (when ``num_crops`` is left at its default 2);
        ``buffer_params.embedding_dim`` from the head's last dim; ``world_size`` and
        ``effective_batch_size`` (``BATCHSIZE_PER_REPLICA * world_size * num_crops``, the
        rows of the gathered buffer) from the batch size and the world size.

        Raises:
            ConfigError: the collator is not ``multicrop_collator``, or ``num_crops``
                contradicts the transform.
        """
        train = (config.get("DATA") or {}).get("TRAIN") or {}
        collator = train.get("COLLATE_FUNCTION")
        if collator != "multicrop_collator":
            raise ConfigError(
                f"{_KEY} needs the crops of each sample side by side, crop-major: set "
                f"config.DATA.TRAIN.COLLATE_FUNCTION: multicrop_collator (got {collator!r}).",
                "config.DATA.TRAIN.COLLATE_FUNCTION",
            )
        out = copy.deepcopy(dict(params))
        total = _multicrop_total(config)
        num_crops = out.get("num_crops", 2)
        if total is not None and num_crops != total:
            if num_crops != 2:
                raise ConfigError(
                    f"{_KEY}.num_crops={num_crops} but the ImgPilToMultiCrop transform of "
                    f"config.DATA.TRAIN.TRANSFORMS makes total_num_crops={total} crops; "
                    "remove num_crops (it is inferred) or make them agree.",
                    f"{_KEY}.num_crops",
                )
            logger.info("%s.num_crops set to %d (ImgPilToMultiCrop)", _KEY, total)
            out["num_crops"] = num_crops = total
        if dist.is_available() and dist.is_initialized():
            world_size = get_world_size()
        else:
            distributed = config.get("DISTRIBUTED") or {}
            world_size = int(distributed.get("NUM_NODES", 1)) * int(
                distributed.get("NUM_PROC_PER_NODE", 1)
            )
        buffer_params = dict(out.get("buffer_params") or {})
        head_dim = head_output_dim(config)
        if head_dim is not None and buffer_params.get("embedding_dim") != head_dim:
            logger.info(
                "%s.buffer_params.embedding_dim set to %d, the head's output width (was %s)",
                _KEY,
                head_dim,
                buffer_params.get("embedding_dim"),
            )
            buffer_params["embedding_dim"] = head_dim
        buffer_params["world_size"] = world_size
        batch = train.get("BATCHSIZE_PER_REPLICA")
        if isinstance(batch, int) and isinstance(num_crops, int):
            buffer_params["effective_batch_size"] = batch * world_size * num_crops
        out["buffer_params"] = buffer_params
        return out

    @classmethod
    def from_config(cls, loss_config: Mapping[str, Any]) -> MultiCropSimclrInfoNCELoss:
        """Build from ``LOSS.multicrop_simclr_info_nce_loss``."""
        p = parse(MultiCropSimclrParams, loss_config, _KEY)
        return cls(temperature=p.temperature, num_crops=p.num_crops, **as_dict(p.buffer_params))

    def forward(
        self, output: torch.Tensor | Sequence[torch.Tensor], target: Any = None
    ) -> torch.Tensor:
        """Multi-crop NT-Xent of this rank's embeddings; ``target`` is ignored.

        Args:
            output: ``(num_crops * B, D)`` head output, crop-major (or a list holding it).
            target: unused (self-supervised).
        """
        if not isinstance(output, torch.Tensor):
            outputs = list(output)
            if len(outputs) != 1:
                raise ValueError(
                    f"multicrop_simclr_info_nce_loss expects one output tensor, got {len(outputs)}."
                )
            output = outputs[0]
        normalized = F.normalize(output, dim=1, p=2)
        return self.info_criterion(normalized)

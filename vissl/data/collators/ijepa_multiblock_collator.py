"""``ijepa_multiblock_collator``: I-JEPA's multi-block masks (Assran et al., *Self-Supervised
Learning from Images with a Joint-Embedding Predictive Architecture*, CVPR 2023, section 3).

Per batch of ``B`` images cut into an ``h x w`` grid of ``patch_size`` patches:

1. one target block size and one context block size are drawn for the whole batch (as
   I-JEPA's collator does, so that the blocks of a batch are about the same size): a scale
   ``s`` uniform in ``target_scale`` (``context_scale``) and an aspect ratio ``a`` uniform in
   ``target_aspect_ratio`` (``context_aspect_ratio``); the block covers
   ``int(h * w * s)`` patches, ``round(sqrt(area * a))`` rows by ``round(sqrt(area / a))``
   columns, clipped to the grid;
2. per image, ``num_target_blocks`` target blocks (the paper: 4, scale (0.15, 0.2), aspect
   ratio (0.75, 1.5)) are placed uniformly (they may overlap one another);
3. per image, one context block (the paper: scale (0.85, 1.0), aspect ratio 1) is placed
   uniformly and the target blocks' patches are removed from it (unless
   ``allow_overlap``), so the context never shows a target patch. A context left with
   ``min_context_patches`` patches or fewer is drawn again (it must keep more, as
   I-JEPA's ``len(mask) > min_keep``); after ``max_tries`` failures the last target block
   stops constraining it, then the one before, ... (I-JEPA's fallback);
4. so that the context tokens and the target tokens of the batch form tensors, every
   context keeps only its first ``K_c`` patches (row-major), ``K_c`` the smallest context
   of the batch, and every target block its first ``K_t`` patches, ``K_t`` the smallest
   block of the batch (I-JEPA's ``min_keep`` truncation).

The draws come from a generator seeded by the batch's seed, a hash of (SEED_VALUE, epoch,
the batch's sample indices) that ``GenericSSLDataset`` attaches to the batch: the masks are
the same with any number of data loader workers and after a resume (a list built by hand
without that seed is seeded from its samples' ``data_idx``).

Differences from I-JEPA's code, where the paper is silent: the scale and the aspect ratio
are drawn independently (the code uses one uniform number for both), and a block may touch
the last row and column of the grid and span it whole (the code's ``randint(0, h - bh)``
and ``bh < h`` keep one row and column out of reach).

Output, for ``B`` samples with one image each::

    {"data": [Tensor(B, C, H, W)],
     "mask": [Tensor(B, h, w) bool],              # True = NOT in the context (dropped)
     "target_masks": [Tensor(B, M, h, w) bool],   # True = in target block m
     "label": [...], "data_valid": [...], "data_idx": [...]}

``mask`` goes to the context encoder (``vision_transformer`` with
``MASKED_IMAGE_MODELING.NAME: mae`` encodes the context patches only), ``mask`` and
``target_masks`` to the predictor (``ijepa_predictor``), ``target_masks`` to the loss
(``ijepa_loss``); see docs/methods/ijepa.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate as torch_default_collate

from vissl.data.collators import register_collator
from vissl.data.collators._common import check_batch, check_tensor_data
from vissl.errors import ConfigError

NAME = "ijepa_multiblock_collator"
_KEY = "config.DATA.<split>.COLLATE_FUNCTION_PARAMS"
#: the first entropy word of the seed of a batch that carries none of its own
_FALLBACK_STREAM = 0x696A6570


@dataclass(frozen=True)
class MultiBlockSettings:
    """The checked ``COLLATE_FUNCTION_PARAMS`` of ``ijepa_multiblock_collator``."""

    patch_size: int = 16
    num_target_blocks: int = 4
    target_scale: tuple[float, float] = (0.15, 0.2)
    target_aspect_ratio: tuple[float, float] = (0.75, 1.5)
    context_scale: tuple[float, float] = (0.85, 1.0)
    context_aspect_ratio: tuple[float, float] = (1.0, 1.0)
    min_context_patches: int = 10
    allow_overlap: bool = False
    max_tries: int = 20


def _int(params: Mapping[str, Any], name: str, default: int, minimum: int, key_path: str) -> int:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        full = f"{key_path}.{name}"
        raise ConfigError(f"{full} must be an integer >= {minimum}, got {value!r}.", full)
    return value


def _range(
    params: Mapping[str, Any],
    name: str,
    default: tuple[float, float],
    key_path: str,
    upper: float | None,
) -> tuple[float, float]:
    value = params.get(name, default)
    full = f"{key_path}.{name}"
    ok = (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    )
    if not ok or not 0 < value[0] <= value[1] or (upper is not None and value[1] > upper):
        bound = f" <= {upper}" if upper is not None else ""
        raise ConfigError(
            f"{full} must be [low, high] with 0 < low <= high{bound}, got {value!r} "
            f"(I-JEPA: {list(default)}).",
            full,
        )
    return float(value[0]), float(value[1])


def multiblock_settings(params: Mapping[str, Any], key_path: str = _KEY) -> MultiBlockSettings:
    """Validate the collator's parameters.

    Raises:
        ConfigError: an unknown parameter or a bad value, naming its key.
    """
    known = set(MultiBlockSettings.__dataclass_fields__)
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConfigError(
            f"{key_path}: {NAME} has no parameter(s) {unknown}; it takes {sorted(known)}.",
            f"{key_path}.{unknown[0]}",
        )
    allow_overlap = params.get("allow_overlap", False)
    if not isinstance(allow_overlap, bool):
        raise ConfigError(
            f"{key_path}.allow_overlap must be True or False, got {allow_overlap!r}.",
            f"{key_path}.allow_overlap",
        )
    return MultiBlockSettings(
        patch_size=_int(params, "patch_size", 16, 1, key_path),
        num_target_blocks=_int(params, "num_target_blocks", 4, 1, key_path),
        target_scale=_range(params, "target_scale", (0.15, 0.2), key_path, 1.0),
        target_aspect_ratio=_range(params, "target_aspect_ratio", (0.75, 1.5), key_path, None),
        context_scale=_range(params, "context_scale", (0.85, 1.0), key_path, 1.0),
        context_aspect_ratio=_range(params, "context_aspect_ratio", (1.0, 1.0), key_path, None),
        min_context_patches=_int(params, "min_context_patches", 10, 0, key_path),
        allow_overlap=allow_overlap,
        max_tries=_int(params, "max_tries", 20, 1, key_path),
    )


def check_params(params: Mapping[str, Any], key_path: str = _KEY) -> None:
    """Check ``COLLATE_FUNCTION_PARAMS`` when the data loader is built."""
    multiblock_settings(params, key_path)


# --------------------------------------------------------------------------- the draws
def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    return low + (high - low) * float(torch.rand((), generator=generator))


def block_size(
    grid: tuple[int, int],
    scale: tuple[float, float],
    aspect_ratio: tuple[float, float],
    generator: torch.Generator,
) -> tuple[int, int]:
    """``(rows, columns)`` of a block: ``int(h * w * s)`` patches (at least 1), aspect ratio
    ``a`` (rows / columns), ``s`` and ``a`` drawn uniformly; clipped to the grid."""
    height, width = grid
    s = _uniform(*scale, generator)
    a = _uniform(*aspect_ratio, generator)
    area = max(1, int(height * width * s))
    rows = min(max(1, round(math.sqrt(area * a))), height)
    cols = min(max(1, round(math.sqrt(area / a))), width)
    return rows, cols


def place_block(
    grid: tuple[int, int], size: tuple[int, int], generator: torch.Generator
) -> torch.Tensor:
    """A boolean ``(h, w)`` mask of one block of ``size`` at a uniform position."""
    height, width = grid
    rows, cols = size
    top = int(torch.randint(0, height - rows + 1, (), generator=generator))
    left = int(torch.randint(0, width - cols + 1, (), generator=generator))
    mask = torch.zeros(height, width, dtype=torch.bool)
    mask[top : top + rows, left : left + cols] = True
    return mask


def context_block(
    grid: tuple[int, int],
    size: tuple[int, int],
    targets: Sequence[torch.Tensor],
    settings: MultiBlockSettings,
    generator: torch.Generator,
) -> torch.Tensor:
    """The context of one image: a block of ``size`` less the ``targets``' patches (see the
    module docstring for the retries)."""
    constraints = 0 if settings.allow_overlap else len(targets)
    while True:
        for _ in range(settings.max_tries):
            block = place_block(grid, size, generator)
            for target in targets[:constraints]:
                block &= ~target
            # more than min_context_patches, as I-JEPA's ``len(mask) > self.min_keep``
            if int(block.sum()) > settings.min_context_patches or constraints == 0:
                return block
        constraints -= 1


def keep_first(mask: torch.Tensor, count: int) -> torch.Tensor:
    """``mask`` (boolean, any shape) with only its first ``count`` True entries (row-major)."""
    flat = mask.flatten()
    kept = flat & (flat.cumsum(0) <= count)
    return kept.reshape(mask.shape)


def batch_generator(batch: Sequence[Mapping[str, Any]]) -> torch.Generator:
    """The generator of a batch's masks: seeded by the batch's ``seed`` (see
    :func:`vissl.data.samplers.batch_seed`), else from its samples' ``data_idx``."""
    seed = getattr(batch, "seed", None)
    if seed is None:
        indices = [int(i) for sample in batch for i in sample["data_idx"]]
        seed = int(np.random.SeedSequence([_FALLBACK_STREAM, *indices]).generate_state(1)[0])
    generator = torch.Generator()
    generator.manual_seed(int(seed))
    return generator


def multiblock_masks(
    batch_size: int,
    grid: tuple[int, int],
    settings: MultiBlockSettings,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(context, targets)`` of a batch: ``(B, h, w)`` True = in the context, and
    ``(B, M, h, w)`` True = in target block m, already truncated to the batch's smallest
    context and smallest target block (step 4 of the module docstring)."""
    target_size = block_size(grid, settings.target_scale, settings.target_aspect_ratio, generator)
    context_size = block_size(
        grid, settings.context_scale, settings.context_aspect_ratio, generator
    )
    contexts, targets = [], []
    for _ in range(batch_size):
        blocks = [
            place_block(grid, target_size, generator) for _ in range(settings.num_target_blocks)
        ]
        contexts.append(context_block(grid, context_size, blocks, settings, generator))
        targets.append(torch.stack(blocks))
    context = torch.stack(contexts)
    target = torch.stack(targets)
    num_context = int(context.flatten(1).sum(1).min())
    num_target = int(target.flatten(2).sum(2).min())
    context = torch.stack([keep_first(c, num_context) for c in context])
    target = torch.stack([torch.stack([keep_first(t, num_target) for t in row]) for row in target])
    return context, target


@register_collator(NAME)
def ijepa_multiblock_collator(batch: Sequence[dict[str, Any]], **params: Any) -> dict[str, Any]:
    """Collate ``B`` single-image samples and draw their I-JEPA masks (see the module
    docstring; ``params`` are :class:`MultiBlockSettings`' fields).

    Raises:
        ConfigError: a sample with several images, images that are not tensors or not a
            whole number of patches, or bad parameters.
    """
    settings = multiblock_settings(params)
    num_views = check_batch(batch, NAME)
    check_tensor_data(batch, NAME)
    if num_views != 1:
        raise ConfigError(
            f"{NAME}: each sample must hold one image, got {num_views}; I-JEPA takes one "
            "view per image (one data source and no multi-crop transform).",
            "config.DATA.<split>.TRANSFORMS",
        )
    height, width = (int(s) for s in batch[0]["data"][0].shape[-2:])
    p = settings.patch_size
    if height % p or width % p:
        raise ConfigError(
            f"{NAME}: the images are {height}x{width} px, not a whole number of {p} px "
            "patches: make the crop size a multiple of patch_size, which must equal the "
            "trunk's PATCH_SIZE.",
            f"{_KEY}.patch_size",
        )
    context, target = multiblock_masks(
        len(batch), (height // p, width // p), settings, batch_generator(batch)
    )
    output = torch_default_collate([{k: v for k, v in s.items() if k != "mask"} for s in batch])
    output["mask"] = [~context]
    output["target_masks"] = [target]
    return output


ijepa_multiblock_collator.check_params = check_params  # type: ignore[attr-defined]

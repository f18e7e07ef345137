"""Patch masks for masked-image methods, drawn from torch's global CPU generator.

A mask is a boolean ``(h, w)`` tensor over an image's patch grid, ``True`` = masked. The
data pipeline seeds the global generators of each sample from (``SEED_VALUE``, epoch,
sample index) (:mod:`vissl.data.ssl_transforms.seeding`), so the masks drawn by the
masking transforms (:mod:`vissl.data.ssl_transforms.masked_image_modeling`) are a function
of those three numbers only: the same on any rank, worker or batch composition, and again
after a resume.

- :func:`random_mask`: a fixed number of patches chosen uniformly at random (MAE, He et
  al. 2022; the same count in every image, so the visible patches form one batch).
- :func:`block_mask`: rectangles of random area and aspect ratio until a target number
  of patches is covered (BEiT's block-wise masking, Bao et al. 2022; iBOT uses it).
"""

from __future__ import annotations

import math

import torch

__all__ = ["block_mask", "num_kept", "random_mask"]


def num_kept(num_patches: int, mask_ratio: float) -> int:
    """Visible patches of a :func:`random_mask`: ``int(L * (1 - ratio))``, MAE's rounding,
    at least 1."""
    return max(1, int(num_patches * (1.0 - mask_ratio)))


def random_mask(grid: tuple[int, int], mask_ratio: float) -> torch.Tensor:
    """Hide ``L - num_kept(L, mask_ratio)`` of the ``L = h * w`` patches, chosen uniformly.

    One ``torch.rand(L)`` draw (MAE's per-sample noise); the patches with the smallest
    noise stay visible.
    """
    height, width = grid
    length = height * width
    keep = num_kept(length, mask_ratio)
    order = torch.argsort(torch.rand(length))
    mask = torch.ones(length, dtype=torch.bool)
    mask[order[:keep]] = False
    return mask.reshape(height, width)


def _uniform(low: float, high: float) -> float:
    return low + (high - low) * float(torch.rand(()))


def _randint(low: int, high: int) -> int:
    """An integer in ``[low, high]`` (both included)."""
    return int(torch.randint(low, high + 1, ()))


def block_mask(
    grid: tuple[int, int],
    num_masked: int,
    min_num_patches: int | None = None,
    log_aspect_ratio: tuple[float, float] = (math.log(0.3), math.log(1 / 0.3)),
    max_attempts: int = 10,
) -> torch.Tensor:
    """BEiT's block-wise mask: about ``num_masked`` patches covered by rectangles.

    Each round draws up to ``max_attempts`` rectangles (area uniform between
    ``min_num_patches`` and the patches still to cover, in either order as Python's
    ``random.uniform``; log aspect ratio uniform in ``log_aspect_ratio``; sides rounded;
    position uniform) and keeps the first that is strictly smaller than the grid (``h < H``
    and ``w < W``) and covers new patches without exceeding the target; the rounds stop
    when the target is reached or a round adds nothing, so a mask may cover a few patches
    less than asked. This is iBOT's ``ImageFolderMask`` and BEiT's / DINOv2's
    ``MaskingGenerator`` draw for draw (DINOv2's per-block cap ``max_num_patches`` aside);
    on grids under 3 patches a side the smallest area is 1 here, 0 in iBOT.

    Args:
        grid: the patch grid (h, w).
        num_masked: the number of patches to cover (at most ``h * w``).
        min_num_patches: the smallest rectangle area; default ``(min(h, w) // 3) ** 2``
            (iBOT's; at least 1).
        log_aspect_ratio: the range of ``log(height / width)`` of the rectangles.
        max_attempts: rectangles drawn per round before giving up.
    """
    height, width = grid
    mask = torch.zeros(height, width, dtype=torch.bool)
    target = min(int(num_masked), height * width)
    low = max(1, (min(height, width) // 3) ** 2 if min_num_patches is None else min_num_patches)
    covered = 0
    while covered < target:
        room = target - covered
        added = 0
        for _ in range(max_attempts):
            area = _uniform(low, room)  # in [room, low] when low > room, as random.uniform
            aspect = math.exp(_uniform(*log_aspect_ratio))
            h = round(math.sqrt(area * aspect))
            w = round(math.sqrt(area / aspect))
            if not (0 < h < height and 0 < w < width):  # iBOT's and BEiT's strict bounds
                continue
            top, left = _randint(0, height - h), _randint(0, width - w)
            block = mask[top : top + h, left : left + w]
            new = h * w - int(block.sum())
            if 0 < new <= room:
                block.fill_(True)
                added = new
                break
        if added == 0:
            break
        covered += added
    return mask

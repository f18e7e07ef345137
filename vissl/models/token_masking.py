"""Tensor helpers of the masked-image methods (MAE, iBOT, I-JEPA, MSN): masks over patch
grids, keeping the visible tokens, restoring the full sequence, patchifying images and the
fixed 2-D sin-cos position embedding.

A mask is a boolean tensor over the patch grid, ``(N, h, w)`` or flattened ``(N, h * w)``,
in the patch order of the ViT (row-major); ``True`` marks a *masked* patch (MAE's ``1 is
remove``, iBOT's ``True`` is masked). Where only the visible patches are encoded (MAE), every
row must hide the same number of patches, so that the visible tokens form one batch.
"""

from __future__ import annotations

import torch

__all__ = [
    "flatten_mask",
    "gather_tokens",
    "keep_indices",
    "patchify",
    "restore_indices",
    "sincos_2d_embedding",
    "sincos_2d_position_embedding",
    "unpatchify",
    "visible_count",
]


def flatten_mask(mask: torch.Tensor, grid: tuple[int, int], batch_size: int) -> torch.Tensor:
    """``mask`` as a boolean ``(N, h * w)`` tensor, checked against the patch grid.

    Raises:
        ValueError: the mask's shape does not match the batch size and the grid.
    """
    height, width = grid
    if mask.ndim == 3 and tuple(mask.shape) == (batch_size, height, width):
        mask = mask.flatten(1)
    if tuple(mask.shape) != (batch_size, height * width):
        raise ValueError(
            f"the patch mask has shape {tuple(mask.shape)} but the images give {batch_size} "
            f"rows of a {height}x{width} patch grid: expected ({batch_size}, {height}, "
            f"{width}) or ({batch_size}, {height * width}). Make the masking transform's "
            "patch_size and the images' size agree with the trunk's PATCH_SIZE."
        )
    return mask if mask.dtype == torch.bool else mask.ne(0)


def visible_count(mask: torch.Tensor) -> int:
    """The number of visible (``False``) patches of each row of a flat mask; one host read.

    Raises:
        ValueError: the rows hide different numbers of patches (the visible tokens could not
            form one batch), or a row hides every patch.
    """
    counts = (~mask).sum(dim=1)
    low, high = torch.stack(torch.aminmax(counts)).tolist()  # one read for both
    if low != high:
        raise ValueError(
            f"the patch masks of the batch keep between {low} and {high} visible patches; "
            "encoding the visible patches only needs the same number in every row. Use a "
            "masking transform with a fixed ratio (RandomPatchMasking) for MAE-style masking."
        )
    if low == 0:
        raise ValueError("the patch mask hides every patch of the image; keep at least one.")
    return low


def keep_indices(mask: torch.Tensor, num_visible: int) -> torch.Tensor:
    """``(N, num_visible)`` indices of each row's visible patches, in increasing order."""
    order = torch.argsort(mask.to(torch.uint8), dim=1, stable=True)
    return order[:, :num_visible]


def restore_indices(mask: torch.Tensor) -> torch.Tensor:
    """``(N, L)``: where each patch sits in ``[visible patches..., masked patches...]``.

    Gathering a ``[visible, masked]`` sequence with these indices puts every token back at
    its patch position (MAE's ``ids_restore``).
    """
    order = torch.argsort(mask.to(torch.uint8), dim=1, stable=True)
    return torch.argsort(order, dim=1)


def gather_tokens(tokens: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``tokens[n, indices[n]]`` for ``(N, L, D)`` tokens and ``(N, K)`` indices."""
    return tokens.gather(1, indices.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``(N, C, H, W)`` images as ``(N, h * w, p * p * C)`` patches, row-major, each patch's
    values in (row, column, channel) order (MAE's layout).

    Raises:
        ValueError: a side of the images is not a multiple of ``patch_size``.
    """
    n, c, height, width = images.shape
    p = patch_size
    if height % p or width % p:
        raise ValueError(
            f"cannot cut {height}x{width} images into {p}x{p} patches: both sides must be "
            "multiples of the patch size."
        )
    h, w = height // p, width // p
    x = images.reshape(n, c, h, p, w, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(n, h * w, p * p * c)


def unpatchify(patches: torch.Tensor, patch_size: int, grid: tuple[int, int]) -> torch.Tensor:
    """The inverse of :func:`patchify`: ``(N, h * w, p * p * C)`` to ``(N, C, h p, w p)``."""
    n, length, dim = patches.shape
    h, w = grid
    p = patch_size
    c = dim // (p * p)
    if length != h * w or c * p * p != dim:
        raise ValueError(
            f"patches of shape {tuple(patches.shape)} do not fit a {h}x{w} grid of {p}x{p} patches."
        )
    x = patches.reshape(n, h, w, p, p, c).permute(0, 5, 1, 3, 2, 4)
    return x.reshape(n, c, h * p, w * p)


def _sincos_1d(dim: int, positions: torch.Tensor) -> torch.Tensor:
    omega = torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0)
    omega = 1.0 / 10000**omega
    angles = positions.reshape(-1, 1).to(torch.float64) * omega.reshape(1, -1)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def _check_sincos_dim(dim: int) -> None:
    if dim % 4:
        raise ValueError(
            f"a 2-D sin-cos position embedding needs a width divisible by 4, not {dim}."
        )


def sincos_2d_position_embedding(height: int, width: int, dim: int) -> torch.Tensor:
    """The fixed 2-D sin-cos position embedding of MoCo v3, ``(height * width, dim)``.

    Half of the channels encode the row, half the column; each half is
    ``[sin(pos * w_k), cos(pos * w_k)]`` with ``w_k = 10000^(-k / (dim / 4))``. MAE's and
    I-JEPA's code put the column half first (:func:`sincos_2d_embedding` with
    ``columns_first``), a permutation of the channels.

    Raises:
        ValueError: ``dim`` is not a multiple of 4.
    """
    _check_sincos_dim(dim)
    return sincos_2d_embedding(
        torch.arange(height, dtype=torch.float64), torch.arange(width, dtype=torch.float64), dim
    )


def sincos_2d_embedding(
    rows: torch.Tensor, cols: torch.Tensor, dim: int, *, columns_first: bool = False
) -> torch.Tensor:
    """The 2-D sin-cos embedding of the grid ``rows x cols`` (positions in patch units, any
    real numbers), ``(len(rows) * len(cols), dim)`` float32 in row-major order.

    ``columns_first`` puts the column's ``dim / 2`` channels first (MAE's and I-JEPA's
    ``get_2d_sincos_pos_embed``); otherwise the row's (MoCo v3's).

    Raises:
        ValueError: ``dim`` is not a multiple of 4.
    """
    _check_sincos_dim(dim)
    grid_rows, grid_cols = torch.meshgrid(
        rows.to(torch.float64), cols.to(torch.float64), indexing="ij"
    )
    halves = [_sincos_1d(dim // 2, grid_rows), _sincos_1d(dim // 2, grid_cols)]
    if columns_first:
        halves.reverse()
    return torch.cat(halves, dim=1).to(torch.float32)

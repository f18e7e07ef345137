"""``ImgPatchesFromTensor``: a ``(C, H, W)`` image cut into a grid of jittered patches.

Jigsaw (Noroozi & Favaro, ECCV 2016) splits an image into a 3 x 3 grid of cells and
takes one patch from each cell, a few pixels smaller than the cell and at a random
offset inside it, so that the patches do not touch and the network cannot solve the
puzzle by continuing lines and textures across borders.

With ``g = sqrt(num_patches)`` and a ``H x W`` image, the cells are ``H // g`` by
``W // g`` pixels and each patch is ``patch_jitter`` pixels smaller than its cell in both
directions, starting at offsets drawn uniformly from ``0 .. patch_jitter - 1`` (VISSL's
rule: a 255 px crop gives 85 px cells and 64 px patches with ``patch_jitter: 21``).
Patches are listed in VISSL's order, column by column: patch ``k`` comes from the cell in
column ``k // g`` and row ``k % g`` (so a permutation file and head trained with VISSL
mean the same here).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from vissl.data.ssl_transforms import register_transform
from vissl.errors import ConfigError

_ARGS = ("num_patches", "patch_jitter")


def grid_side(num_patches: Any, key: str) -> int:
    """``sqrt(num_patches)`` for a square ``num_patches`` >= 1, or a ConfigError naming ``key``."""
    if isinstance(num_patches, bool) or not isinstance(num_patches, int) or num_patches < 1:
        raise ConfigError(
            f"{key} must be a positive square integer (Jigsaw uses 9: a 3 x 3 grid), "
            f"got {num_patches!r}.",
            key,
        )
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ConfigError(
            f"{key} must be a square number of patches (4, 9, 16, ...) so that they form "
            f"a grid; got {num_patches}.",
            key,
        )
    return side


def grid_patches(
    image: Any, side: int, patch_jitter: int, key_path: str = "ImgPatchesFromTensor"
) -> list[Any]:
    """The ``side * side`` jittered patches of a ``(C, H, W)`` tensor or numpy array.

    Draws the ``2 * side * side`` offsets with ``torch.randint`` from torch's global
    generator (seeded per sample by the dataset, so a resumed run draws the same ones).
    Each patch is a copy (its own memory), of the input's type.

    Raises:
        ConfigError: the input is not ``(C, H, W)`` (naming ``key_path``), or its cells
            are not larger than ``patch_jitter`` (naming ``key_path.patch_jitter``).
    """
    if not isinstance(image, torch.Tensor | np.ndarray) or image.ndim != 3:
        shape = f" of shape {tuple(image.shape)}" if hasattr(image, "shape") else ""
        raise ConfigError(
            f"{key_path}: ImgPatchesFromTensor takes a (C, H, W) tensor or numpy array "
            f"(put it after ToTensor); got {type(image).__name__}{shape}.",
            key_path,
        )
    height, width = int(image.shape[1]), int(image.shape[2])
    cell_h, cell_w = height // side, width // side
    patch_h, patch_w = cell_h - patch_jitter, cell_w - patch_jitter
    if patch_h < 1 or patch_w < 1:
        raise ConfigError(
            f"{key_path}.patch_jitter: a {height} x {width} image in a {side} x {side} grid "
            f"has {cell_h} x {cell_w} px cells, no larger than patch_jitter={patch_jitter}: "
            "give a larger image (crop size) or a smaller patch_jitter.",
            f"{key_path}.patch_jitter",
        )
    # offsets[0] along the width, offsets[1] along the height, indexed [column, row]
    offsets = torch.randint(0, patch_jitter, (2, side, side)).tolist()
    patches = []
    for col in range(side):
        for row in range(side):
            top = row * cell_h + offsets[1][col][row]
            left = col * cell_w + offsets[0][col][row]
            patch = image[:, top : top + patch_h, left : left + patch_w]
            patches.append(patch.clone() if isinstance(patch, torch.Tensor) else patch.copy())
    return patches


@register_transform("ImgPatchesFromTensor")
class ImgPatchesFromTensor:
    """Cut a ``(C, H, W)`` tensor (or numpy array) into ``num_patches`` jittered patches.

    Returns the list of patches (column by column, see the module docstring); follow it
    with ``ShuffleImgPatches`` for Jigsaw.

    Args:
        num_patches: a square number of patches (default 9, a 3 x 3 grid).
        patch_jitter: how many pixels each patch is smaller than its cell; its offset in
            the cell is drawn from ``0 .. patch_jitter - 1`` in each direction
            (default 21, VISSL's for 255 px crops).
    """

    ssl_transform_kind: ClassVar[str] = "image"

    def __init__(
        self, num_patches: int = 9, patch_jitter: int = 21, key_path: str = "ImgPatchesFromTensor"
    ) -> None:
        self.side = grid_side(num_patches, f"{key_path}.num_patches")
        if isinstance(patch_jitter, bool) or not isinstance(patch_jitter, int) or patch_jitter < 1:
            raise ConfigError(
                f"{key_path}.patch_jitter must be an integer >= 1 (the patch is that many "
                f"pixels smaller than its grid cell; VISSL uses 21 for 255 px crops), got "
                f"{patch_jitter!r}.",
                f"{key_path}.patch_jitter",
            )
        self.num_patches = num_patches
        self.patch_jitter = patch_jitter
        self.key_path = key_path

    @classmethod
    def from_transform_config(
        cls, kwargs: Mapping[str, Any], key_path: str
    ) -> ImgPatchesFromTensor:
        unknown = sorted(set(kwargs) - set(_ARGS))
        if unknown:
            raise ConfigError(
                f"{key_path}: ImgPatchesFromTensor has no argument(s) {unknown}; it takes "
                "num_patches and patch_jitter.",
                f"{key_path}.{unknown[0]}",
            )
        return cls(**kwargs, key_path=key_path)

    def __call__(self, image: Any) -> list[Any]:
        return grid_patches(image, self.side, self.patch_jitter, self.key_path)

    def __repr__(self) -> str:
        return (
            f"ImgPatchesFromTensor(num_patches={self.num_patches}, "
            f"patch_jitter={self.patch_jitter})"
        )

"""R-MAC: regional maximum activations of convolutions (Tolias et al., ICLR 2016).

Square regions at ``L`` scales tile the feature map (scale ``l`` has side
``floor(2 min(H, W) / (l + 1))``, about 40% overlap, and extra positions along the
longer side); each region is max-pooled to a ``C``-vector and L2-normalised; with a PCA
whitening the vectors are whitened and L2-normalised again; their sum, L2-normalised, is
the image's descriptor.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

_OVERLAP = 0.4
_EPS = 1e-12


def normalize_l2(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x / ||x||`` along ``dim`` (a zero vector stays zero)."""
    return x / x.norm(p=2, dim=dim, keepdim=True).clamp(min=_EPS)


def _centers(length: int, side: float, count: int) -> list[int]:
    """``count`` region starts spread evenly over ``[0, length - side]`` (Tolias' rule)."""
    half = math.floor(side / 2 - 1)
    step = (length - side) / (count - 1) if count > 1 else 0.0
    return [int(math.floor(half + step * k) - half) for k in range(count)]


def get_rmac_region_coordinates(H: int, W: int, L: int) -> np.ndarray:
    """The R-MAC regions ``[x, y, w, h]`` (x along the width) of an ``H x W`` map at ``L``
    scales, as ``(n_regions, 4)`` integers inside the map."""
    short = min(H, W)
    steps = np.arange(2, 8, dtype=np.float64)
    # how many extra regions the longer side gets: the count whose overlap is closest to 40%
    gap = (max(H, W) - short) / (steps - 1)
    extra = int(np.argmin(np.abs((short**2 - short * gap) / short**2 - _OVERLAP))) + 1
    extra_w = extra if H < W else 0
    extra_h = extra if H > W else 0
    regions = []
    for level in range(1, L + 1):
        side = math.floor(2 * short / (level + 1))
        if side == 0:
            continue
        xs = _centers(W, side, level + extra_w)
        ys = _centers(H, side, level + extra_h)
        for y in ys:
            for x in xs:
                regions.append([min(x, W - side), min(y, H - side), side, side])
    return np.asarray(regions, dtype=np.int64).reshape(-1, 4)


def get_rmac_descriptors(
    features: torch.Tensor, rmac_levels: int, pca: Any = None, normalize: bool = True
) -> torch.Tensor:
    """R-MAC descriptors of ``(N, C, H, W)`` features.

    Args:
        features: the feature maps.
        rmac_levels: ``L``, the number of region scales (``IMG_RETRIEVAL.SPATIAL_LEVELS``).
        pca: a fitted :class:`vissl.evaluation.pca.PCA` (whitening of the region vectors), or None.
        normalize: L2-normalise the region vectors and the result (R-MAC does).

    Returns:
        Without ``pca`` the region vectors ``(N, n_regions, C)`` (what PCA whitening is
        trained on); with it the aggregated descriptors ``(N, n_components)``.
    """
    n, c, h, w = features.shape
    regions = get_rmac_region_coordinates(h, w, rmac_levels)
    pooled = [features[:, :, y : y + rh, x : x + rw].amax(dim=(2, 3)) for x, y, rw, rh in regions]
    vectors = torch.stack(pooled, dim=1)  # (N, R, C)
    if normalize:
        vectors = normalize_l2(vectors, dim=2)
    if pca is None:
        return vectors
    r = vectors.shape[1]
    whitened = torch.from_numpy(pca.transform(vectors.reshape(n * r, c).double())).to(
        features.dtype
    )
    if normalize:
        whitened = normalize_l2(whitened, dim=1)
    summed = whitened.reshape(n, r, -1).sum(dim=1)
    return normalize_l2(summed, dim=1) if normalize else summed

"""Each sample's distance to its nearest other sample (VISSL's ``RANKING``: the most isolated
images of a data set first), on extracted features; the benchmark is
:mod:`vissl.evaluation.benchmarks.ranking` (``tools/extract_feature_and_rank.py``)."""

from __future__ import annotations

import numpy as np
import torch

from vissl.errors import ConfigError

_KEY = "config.RANKING"


def l2_rows(x: np.ndarray) -> np.ndarray:
    """Rows divided by their norm + 1e-5 (VISSL's)."""
    return x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-5)


def nearest_neighbour_distances(
    features: np.ndarray, use_faiss: bool, device: str = "cpu", chunk: int = 4096
) -> np.ndarray:
    """Each row's squared Euclidean distance to its nearest *other* row.

    ``use_faiss``: a flat L2 index searched for 2 neighbours (the row itself and the next,
    as VISSL does); otherwise exact chunked search in torch on ``device``.
    """
    x = np.ascontiguousarray(features, dtype=np.float32)
    if len(x) < 2:
        raise ConfigError(
            f"ranking needs at least 2 samples, got {len(x)}.", f"{_KEY}.FEATURES.DATA_PARTITION"
        )
    if use_faiss:
        import faiss

        if device == "cuda":
            index = faiss.GpuIndexFlatL2(faiss.StandardGpuResources(), x.shape[1])
        else:
            index = faiss.IndexFlatL2(x.shape[1])
        index.add(x)
        distances, _ = index.search(x, 2)
        return np.asarray(distances[:, 1], dtype=np.float64)
    t = torch.from_numpy(x).to(device=device, dtype=torch.float64)
    sq = (t * t).sum(1)
    out = torch.empty(len(t), dtype=torch.float64, device=device)
    for start in range(0, len(t), chunk):
        block = t[start : start + chunk]
        d = sq[start : start + chunk, None] + sq[None, :] - 2 * block @ t.T
        rows = torch.arange(block.shape[0], device=device)
        d[rows, rows + start] = float("inf")  # not the sample itself
        out[start : start + chunk] = d.clamp(min=0).min(dim=1).values
    return out.cpu().numpy()

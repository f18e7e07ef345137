"""PCA whitening of features (VISSL's ``vissl.utils.pca.PCA``).

Fitted on ``X`` (n, d): the mean is removed, the eigenvectors ``V`` of the scatter matrix
``Xc^T Xc`` are sorted by eigenvalue ``e`` (largest first), the first ``n_components`` kept,
and a sample maps to ``diag(1 / sqrt(e)) V^T (x - mean)``. Eigenvalues below
``1e-5 * max(e)`` are raised to that floor, so a rank-deficient input does not divide by 0.
The scale is that of the scatter matrix (not the covariance), as in VISSL; scikit-learn's
``PCA(whiten=True)`` gives the same directions times ``sqrt(n - 1)``, up to sign.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

logger = logging.getLogger(__name__)


class PCA:
    """PCA whitening to ``n_components`` dimensions (all of them for ``n_components <= 0``)."""

    def __init__(self, n_components: int) -> None:
        self.n_components = int(n_components)
        self.mean: np.ndarray | None = None
        self.DVt: np.ndarray | None = None

    def fit(self, X: np.ndarray | torch.Tensor) -> PCA:
        """Fit on the rows of ``X``; ``X`` is not modified."""
        x = _as_float64(X)
        if x.ndim != 2 or x.shape[0] < 2:
            raise ValueError(f"PCA needs a 2-D array of at least 2 rows, got shape {x.shape}")
        if self.n_components > x.shape[1]:
            raise ValueError(
                f"PCA to {self.n_components} dimensions of {x.shape[1]}-dimensional features"
            )
        mean = x.mean(axis=0)
        xc = x - mean
        eigval, eigvec = np.linalg.eigh(xc.T @ xc)
        floor = max(float(eigval.max()), 0.0) * 1e-5
        small = int((eigval < floor).sum())
        if small:
            logger.info("PCA: %d of %d eigenvalues are ~0", small, eigval.size)
        eigval = np.maximum(eigval, floor if floor > 0 else 1e-12)
        order = np.argsort(eigval)[::-1]
        if self.n_components > 0:
            order = order[: self.n_components]
        self.mean = mean
        self.DVt = (eigvec[:, order] / np.sqrt(eigval[order])).T
        return self

    def transform(self, X: np.ndarray | torch.Tensor) -> np.ndarray:
        """Whitened float32 rows of ``X`` (fit first)."""
        if self.mean is None or self.DVt is None:
            raise RuntimeError("PCA.transform before PCA.fit")
        x = _as_float64(X)
        return np.ascontiguousarray(((x - self.mean) @ self.DVt.T).astype(np.float32))

    def fit_transform(self, X: np.ndarray | torch.Tensor) -> np.ndarray:
        """:meth:`fit` then :meth:`transform`."""
        return self.fit(X).transform(X)


def _as_float64(X: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu().numpy()
    return np.asarray(X, dtype=np.float64)

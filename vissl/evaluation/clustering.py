"""ClusterFit's step 1: k-means over extracted features and a pseudo-label per sample.

Used by ``tools/cluster_features_and_label.py`` (the keys are ``config.CLUSTERFIT``, see
:class:`ClusterFitSettings`) and ``tools/cluster_assignments_to_dataset.py``.

The steps, as VISSL's: the features of ``DATA_PARTITION`` are L2-normalised (``x / (|x| +
1e-5)``), optionally PCA-whitened (:class:`vissl.evaluation.pca.PCA`), a subset of
``DATA_LIMIT`` of them (or all) fits ``NUM_CLUSTERS`` centroids with ``NUM_ITER`` Lloyd
iterations (:func:`fit_kmeans`), and every sample of ``DATA_PARTITION`` and
``TEST_PARTITION`` gets the index of its nearest centroid (:func:`assign_to_centroids`).
:func:`save_cluster_labels` writes VISSL's three files per split.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vissl.errors import ConfigError

logger = logging.getLogger(__name__)

_KEY = "config.CLUSTERFIT"
BACKENDS = ("faiss", "sklearn")
PARTITIONS = ("TRAIN", "TEST")


@dataclass(frozen=True)
class ClusterFitSettings:
    """``config.CLUSTERFIT``, checked."""

    output_dir: str
    num_iter: int
    num_clusters: int
    data_limit: int
    seed: int
    backend: str
    extract: bool
    features_path: str
    data_partition: str
    test_partition: str
    dataset_name: str
    layer_name: str
    dim_reduction: int

    @classmethod
    def from_config(cls, clusterfit: Any) -> ClusterFitSettings:
        """Read and check ``config.CLUSTERFIT``.

        Raises:
            ConfigError: a value out of range; the message names the key.
        """
        features = clusterfit.FEATURES

        def integer(value: Any, key: str, minimum: int) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(
                    f"{_KEY}.{key}={value!r}: expected an integer >= {minimum}.",
                    f"{_KEY}.{key}",
                )
            return int(value)

        backend = str(clusterfit.CLUSTER_BACKEND)
        if backend not in BACKENDS:
            raise ConfigError(
                f"{_KEY}.CLUSTER_BACKEND={backend!r}: expected one of {list(BACKENDS)}.",
                f"{_KEY}.CLUSTER_BACKEND",
            )
        data_limit = clusterfit.DATA_LIMIT
        if isinstance(data_limit, bool) or not isinstance(data_limit, int) or data_limit == 0:
            raise ConfigError(
                f"{_KEY}.DATA_LIMIT={data_limit!r}: -1 (every sample) or a positive number of "
                "samples that fit the centroids.",
                f"{_KEY}.DATA_LIMIT",
            )
        partitions = []
        for key, allow_empty in (("DATA_PARTITION", False), ("TEST_PARTITION", True)):
            value = features[key]
            value = "" if value is None else str(value).upper()
            if not (value in PARTITIONS or (allow_empty and value == "")):
                allowed = list(PARTITIONS) + ([""] if allow_empty else [])
                raise ConfigError(
                    f"{_KEY}.FEATURES.{key}={features[key]!r}: expected one of {allowed}.",
                    f"{_KEY}.FEATURES.{key}",
                )
            partitions.append(value)
        if partitions[0] == partitions[1]:
            partitions[1] = ""
        return cls(
            output_dir=str(clusterfit.OUTPUT_DIR),
            num_iter=integer(clusterfit.NUM_ITER, "NUM_ITER", 1),
            num_clusters=integer(clusterfit.NUM_CLUSTERS, "NUM_CLUSTERS", 1),
            data_limit=int(data_limit),
            seed=integer(clusterfit.DATA_LIMIT_SAMPLING.SEED, "DATA_LIMIT_SAMPLING.SEED", 0),
            backend=backend,
            extract=bool(features.EXTRACT),
            features_path=str(features.PATH),
            data_partition=partitions[0],
            test_partition=partitions[1],
            dataset_name=str(features.DATASET_NAME or ""),
            layer_name=str(features.LAYER_NAME or ""),
            dim_reduction=integer(
                features.DIMENSIONALITY_REDUCTION, "FEATURES.DIMENSIONALITY_REDUCTION", 0
            ),
        )


def l2_normalize(features: np.ndarray) -> np.ndarray:
    """Rows divided by their norm + 1e-5 (VISSL's normalisation), as float32."""
    x = np.asarray(features, dtype=np.float32).reshape(len(features), -1)
    return np.ascontiguousarray(x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-5))


def sample_rows(num_rows: int, limit: int, seed: int) -> np.ndarray:
    """Sorted indices of a seeded random subset of ``limit`` rows (all rows for -1)."""
    if limit < 0 or limit >= num_rows:
        return np.arange(num_rows)
    return np.sort(np.random.default_rng(seed).choice(num_rows, size=limit, replace=False))


def faiss_available() -> bool:
    """Whether ``import faiss`` works."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: str) -> str:
    """``faiss`` when asked for and installed; otherwise scikit-learn (logged once)."""
    if backend == "faiss" and not faiss_available():
        logger.warning(
            "%s.CLUSTER_BACKEND=faiss: faiss is not installed (pip install faiss-cpu); "
            "using scikit-learn's KMeans (Lloyd, NUM_ITER iterations) instead.",
            _KEY,
        )
        return "sklearn"
    return backend


def fit_kmeans(
    features: np.ndarray, num_clusters: int, num_iter: int, seed: int, backend: str
) -> np.ndarray:
    """``(num_clusters, d)`` float32 centroids of the rows of ``features`` (Euclidean k-means).

    ``faiss``: ``faiss.Kmeans`` (on the GPU when torch sees one); ``sklearn``:
    ``sklearn.cluster.KMeans`` with k-means++ seeding, one initialisation, ``num_iter``
    Lloyd iterations at most. Both are seeded by ``seed``.

    Raises:
        ConfigError: fewer samples than clusters.
    """
    x = np.ascontiguousarray(features, dtype=np.float32)
    if len(x) < num_clusters:
        raise ConfigError(
            f"{_KEY}.NUM_CLUSTERS={num_clusters} is more than the {len(x)} features that fit "
            "the centroids; lower NUM_CLUSTERS (or raise DATA_LIMIT).",
            f"{_KEY}.NUM_CLUSTERS",
        )
    if resolve_backend(backend) == "faiss":
        import faiss

        kmeans = faiss.Kmeans(
            x.shape[1],
            num_clusters,
            niter=num_iter,
            seed=seed,
            verbose=True,
            gpu=torch.cuda.is_available(),
        )
        kmeans.train(x)
        return np.asarray(kmeans.centroids, dtype=np.float32).reshape(num_clusters, -1)
    from sklearn.cluster import KMeans

    model = KMeans(
        n_clusters=num_clusters,
        init="k-means++",
        n_init=1,
        max_iter=num_iter,
        tol=0.0,
        algorithm="lloyd",
        random_state=seed,
    )
    model.fit(x)
    return np.asarray(model.cluster_centers_, dtype=np.float32)


def assign_to_centroids(
    features: np.ndarray, centroids: np.ndarray, chunk: int = 8192
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's nearest centroid (int64) and its squared distance (float32), in chunks."""
    c = torch.from_numpy(np.ascontiguousarray(centroids, dtype=np.float32))
    c_sq = (c * c).sum(dim=1)
    labels, distances = [], []
    for start in range(0, len(features), chunk):
        x = torch.from_numpy(np.ascontiguousarray(features[start : start + chunk], np.float32))
        d = (x * x).sum(dim=1, keepdim=True) - 2.0 * x @ c.T + c_sq
        best, idx = d.min(dim=1)
        labels.append(idx.numpy().astype(np.int64))
        distances.append(best.clamp_min(0).numpy().astype(np.float32))
    if not labels:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    return np.concatenate(labels), np.concatenate(distances)


def output_prefix(settings: ClusterFitSettings, split: str, layer: str, dim: int) -> str:
    """VISSL's file stem ``{DATASET_NAME}_{split}_{layer}_N{NUM_CLUSTERS}_D{dim}``."""
    name = settings.dataset_name or "dataset"
    return f"{name}_{split.lower()}_{layer}_N{settings.num_clusters}_D{dim}"


def _atomic_save(path: str, write: Any) -> None:
    tmp = f"{path}.tmp"
    write(tmp)
    os.replace(tmp, path)


def save_npy(path: str, array: np.ndarray) -> None:
    """``np.save`` to ``path`` through a temporary file (an old file is kept on failure)."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.save(f, array)

    _atomic_save(path, write)


def save_cluster_labels(
    out_dir: str,
    prefix: str,
    sample_indices: np.ndarray,
    labels: np.ndarray,
    distances: np.ndarray,
    centroids: np.ndarray,
    image_paths: Sequence[str],
) -> dict[str, str]:
    """Write VISSL's ``{prefix}.pkl``, ``{prefix}_labels.npy`` and ``{prefix}_images.npy``.

    ``labels[i]`` is the cluster of dataset sample ``sample_indices[i]``; the arrays are in
    increasing sample-index order. The ``.npy`` of images (the sample's image path) is
    written only when the data source has paths (``image_paths`` not empty).
    """
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, prefix)
    paths = [str(image_paths[int(i)]) for i in sample_indices] if len(image_paths) else []
    hard_labels = np.asarray(labels, dtype=np.int64)
    content: dict[str, Any] = {
        "sample_indices": np.asarray(sample_indices, dtype=np.int64),
        "hard_labels": hard_labels,
        "centroids": np.asarray(centroids, dtype=np.float32),
        "distances": np.asarray(distances, dtype=np.float32),
        "images": paths,
    }

    def write_pickle(tmp: str) -> None:
        with open(tmp, "wb") as f:
            pickle.dump(content, f)

    written = {"pkl": f"{base}.pkl", "labels": f"{base}_labels.npy"}
    _atomic_save(written["pkl"], write_pickle)
    save_npy(written["labels"], hard_labels)
    if paths:
        written["images"] = f"{base}_images.npy"
        save_npy(written["images"], np.array(paths))
    return written


def cluster_size_summary(labels: np.ndarray, num_clusters: int) -> str:
    """``"sizes min/median/max a/b/c, E empty"`` of the clusters."""
    sizes = np.bincount(np.asarray(labels, dtype=np.int64), minlength=num_clusters)
    return (
        f"sizes min/median/max {int(sizes.min())}/{float(np.median(sizes)):g}/"
        f"{int(sizes.max())}, {int((sizes == 0).sum())} empty"
    )

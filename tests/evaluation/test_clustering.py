"""ClusterFit's step-1 pieces: normalisation, PCA whitening, k-means, assignment, files."""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np
import pytest

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.evaluation import clustering as cluster_utils
from vissl.evaluation.clustering import (
    ClusterFitSettings,
    assign_to_centroids,
    cluster_size_summary,
    fit_kmeans,
    l2_normalize,
    output_prefix,
    sample_rows,
    save_cluster_labels,
)
from vissl.evaluation.pca import PCA


def blobs(n_per: int = 40, k: int = 4, d: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=10.0, size=(k, d))
    x = np.concatenate([c + rng.normal(scale=0.3, size=(n_per, d)) for c in centers])
    return x.astype(np.float32), np.repeat(np.arange(k), n_per)


def settings_cfg(**over: Any) -> AttrDict:
    cfg: dict[str, Any] = {
        "OUTPUT_DIR": ".",
        "NUM_ITER": 50,
        "NUM_CLUSTERS": 10,
        "DATA_LIMIT": -1,
        "DATA_LIMIT_SAMPLING": {"SEED": 0},
        "CLUSTER_BACKEND": "faiss",
        "FEATURES": {
            "EXTRACT": False,
            "PATH": ".",
            "DATA_PARTITION": "TRAIN",
            "TEST_PARTITION": "TEST",
            "DATASET_NAME": "",
            "LAYER_NAME": "",
            "DIMENSIONALITY_REDUCTION": 0,
        },
    }
    for key, value in over.items():
        node = cfg
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return AttrDict(cfg)


def test_l2_normalize_is_vissls_formula() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    out = l2_normalize(x)
    expected = x / (np.sqrt((x**2).sum(axis=1, keepdims=True)) + 1e-5)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert out.dtype == np.float32


def test_pca_whitening_matches_sklearn_up_to_sign_and_scale() -> None:
    from sklearn.decomposition import PCA as SkPCA

    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 8)) @ rng.normal(size=(8, 8))
    ours = PCA(3).fit_transform(x)
    theirs = SkPCA(3, whiten=True).fit_transform(x) / np.sqrt(len(x) - 1)
    for j in range(3):
        sign = np.sign(ours[0, j] * theirs[0, j])
        np.testing.assert_allclose(ours[:, j], sign * theirs[:, j], atol=1e-5)
    # whitened: unit scatter per component, uncorrelated
    np.testing.assert_allclose(ours.T.astype(np.float64) @ ours, np.eye(3), atol=1e-4)


def test_pca_of_a_rank_deficient_input_stays_finite() -> None:
    x = np.zeros((10, 4))
    x[:, 0] = np.arange(10)
    assert np.isfinite(PCA(2).fit_transform(x)).all()


def test_sample_rows_is_seeded_and_sorted() -> None:
    a = sample_rows(100, 10, seed=3)
    assert np.array_equal(a, sample_rows(100, 10, seed=3))
    assert not np.array_equal(a, sample_rows(100, 10, seed=4))
    assert len(np.unique(a)) == 10 and np.all(np.diff(a) > 0)
    assert np.array_equal(sample_rows(5, -1, 0), np.arange(5))
    assert np.array_equal(sample_rows(5, 50, 0), np.arange(5))


def test_assign_to_centroids_is_the_nearest_centroid() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(50, 5)).astype(np.float32)
    c = rng.normal(size=(7, 5)).astype(np.float32)
    labels, dist = assign_to_centroids(x, c, chunk=16)  # several chunks
    brute = ((x[:, None, :].astype(np.float64) - c[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(labels, brute.argmin(axis=1))
    np.testing.assert_allclose(dist, brute.min(axis=1), rtol=1e-4, atol=1e-4)


def test_sklearn_kmeans_finds_the_blobs_and_is_a_lloyd_fixed_point() -> None:
    x, truth = blobs()
    centroids = fit_kmeans(x, 4, num_iter=50, seed=0, backend="sklearn")
    labels, _ = assign_to_centroids(x, centroids)
    # each blob is one cluster
    for b in range(4):
        assert len(np.unique(labels[truth == b])) == 1
    assert len(np.unique(labels)) == 4
    # converged Lloyd: every centroid is the mean of its points
    for k in range(4):
        np.testing.assert_allclose(centroids[k], x[labels == k].mean(axis=0), atol=1e-4)
    again = fit_kmeans(x, 4, num_iter=50, seed=0, backend="sklearn")
    np.testing.assert_array_equal(centroids, again)


def test_faiss_backend_falls_back_to_sklearn_when_faiss_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cluster_utils, "faiss_available", lambda: False)
    x, _ = blobs(k=3)
    with caplog.at_level("WARNING"):
        via_faiss = fit_kmeans(x, 3, num_iter=20, seed=0, backend="faiss")
    assert "faiss is not installed" in caplog.text
    np.testing.assert_array_equal(via_faiss, fit_kmeans(x, 3, 20, 0, "sklearn"))


def test_faiss_backend_with_faiss() -> None:
    pytest.importorskip("faiss")
    x, truth = blobs()
    labels, _ = assign_to_centroids(x, fit_kmeans(x, 4, 20, 0, "faiss"))
    for b in range(4):
        assert len(np.unique(labels[truth == b])) == 1


def test_more_clusters_than_samples_names_the_key() -> None:
    x, _ = blobs(n_per=2, k=2)
    with pytest.raises(ConfigError, match=r"config\.CLUSTERFIT\.NUM_CLUSTERS=5 .* 4 features"):
        fit_kmeans(x, 5, 10, 0, "sklearn")


def test_settings_read_and_check_the_keys() -> None:
    s = ClusterFitSettings.from_config(settings_cfg(**{"FEATURES.TEST_PARTITION": "test"}))
    assert (s.backend, s.data_partition, s.test_partition, s.num_clusters) == (
        "faiss",
        "TRAIN",
        "TEST",
        10,
    )
    none = ClusterFitSettings.from_config(settings_cfg(**{"FEATURES.TEST_PARTITION": None}))
    assert none.test_partition == ""
    same = ClusterFitSettings.from_config(settings_cfg(**{"FEATURES.TEST_PARTITION": "TRAIN"}))
    assert same.test_partition == ""
    bad = {
        "CLUSTER_BACKEND": ("kmeans", r"CLUSTER_BACKEND='kmeans'.*faiss"),
        "DATA_LIMIT": (0, r"DATA_LIMIT=0"),
        "NUM_CLUSTERS": (0, r"NUM_CLUSTERS=0: expected an integer >= 1"),
        "NUM_ITER": ("5", r"NUM_ITER='5'"),
        "FEATURES.DATA_PARTITION": ("VAL", r"FEATURES\.DATA_PARTITION='VAL'"),
        "FEATURES.DIMENSIONALITY_REDUCTION": (-1, r"DIMENSIONALITY_REDUCTION=-1"),
    }
    for key, (value, message) in bad.items():
        with pytest.raises(ConfigError, match=message) as err:
            ClusterFitSettings.from_config(settings_cfg(**{key: value}))
        assert err.value.key_path == f"config.CLUSTERFIT.{key}"


def test_save_cluster_labels_writes_vissls_three_files(tmp_path: Any) -> None:
    s = ClusterFitSettings.from_config(
        settings_cfg(**{"FEATURES.DATASET_NAME": "toy", "NUM_CLUSTERS": 3})
    )
    prefix = output_prefix(s, "TRAIN", "res5", 16)
    assert prefix == "toy_train_res5_N3_D16"
    inds = np.array([0, 1, 2, 3])
    labels = np.array([2, 0, 2, 1])
    written = save_cluster_labels(
        str(tmp_path),
        prefix,
        inds,
        labels,
        np.zeros(4, np.float32),
        np.eye(3, 16, dtype=np.float32),
        [f"/img/{i}.jpg" for i in range(4)],
    )
    assert sorted(os.path.basename(p) for p in written.values()) == [
        "toy_train_res5_N3_D16.pkl",
        "toy_train_res5_N3_D16_images.npy",
        "toy_train_res5_N3_D16_labels.npy",
    ]
    np.testing.assert_array_equal(np.load(written["labels"]), labels)
    assert list(np.load(written["images"])) == [f"/img/{i}.jpg" for i in range(4)]
    with open(written["pkl"], "rb") as f:
        content = pickle.load(f)
    assert set(content) == {"sample_indices", "hard_labels", "centroids", "distances", "images"}
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    # an in-memory source: no image file
    only = save_cluster_labels(str(tmp_path / "mem"), prefix, inds, labels, inds, inds, [])
    assert set(only) == {"pkl", "labels"}
    assert cluster_size_summary(labels, 4) == "sizes min/median/max 0/1/2, 1 empty"

"""vissl.evaluation.knn: the weighted kNN equals an independent computation and does not depend
on chunking, memory streaming or the device."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from sklearn.neighbors import NearestNeighbors

from vissl.evaluation import knn
from vissl.evaluation.knn import auto_chunk_sizes, knn_classify, knn_neighbors

NUM_CLASSES = 10


def clustered_features(
    seed: int, n_train: int = 300, n_test: int = 120, dim: int = 16, noise: float = 1.6
) -> dict[str, np.ndarray]:
    """Gaussian blobs around one centre per class: kNN is right often, but not always."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(NUM_CLASSES, dim))
    y_train = rng.integers(0, NUM_CLASSES, n_train)
    y_test = rng.integers(0, NUM_CLASSES, n_test)
    x_train = centres[y_train] + noise * rng.normal(size=(n_train, dim))
    x_test = centres[y_test] + noise * rng.normal(size=(n_test, dim))
    return {
        "x_train": x_train.astype(np.float32),
        "y_train": y_train,
        "x_test": x_test.astype(np.float32),
        "y_test": y_test,
    }


def reference_knn(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    k: int,
    sigma: float,
    l2_normalize: bool = True,
) -> dict[str, Any]:
    """The weighted kNN written independently: scikit-learn finds the neighbours, numpy
    (float64) sums the votes ``exp(sim / sigma)`` (in log space, so that large
    un-normalised similarities do not overflow)."""
    tr = x_train.astype(np.float64)
    te = x_test.astype(np.float64)
    if l2_normalize:
        tr /= np.linalg.norm(tr, axis=1, keepdims=True)
        te /= np.linalg.norm(te, axis=1, keepdims=True)
        # On unit vectors the Euclidean order is the dot-product order.
        finder = NearestNeighbors(n_neighbors=k, algorithm="brute", metric="euclidean")
        finder.fit(tr)
        _, idx = finder.kneighbors(te)
    else:
        # Dot-product neighbours: the largest inner products, as a precomputed "distance".
        finder = NearestNeighbors(n_neighbors=k, algorithm="brute", metric="precomputed")
        sims_all = te @ tr.T
        finder.fit(np.zeros((len(tr), len(tr))))
        _, idx = finder.kneighbors(sims_all.max() - sims_all)
    sims = np.einsum("qd,qkd->qk", te, tr[idx])
    log_votes = sims / sigma
    log_votes -= log_votes.max(axis=1, keepdims=True)
    scores = np.zeros((len(te), NUM_CLASSES))
    for q in range(len(te)):
        np.add.at(scores[q], y_train[idx[q]], np.exp(log_votes[q]))
    ranked = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    hits = ranked == y_test[:, None]
    return {
        "predictions": ranked,
        "top1": 100.0 * hits[:, 0].mean(),
        "top5": 100.0 * hits.any(axis=1).mean(),
        "neighbors": idx,
    }


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("k", "sigma"), [(1, 0.07), (5, 0.07), (20, 0.07), (20, 0.5)])
def test_knn_equals_sklearn_reference(seed: int, k: int, sigma: float) -> None:
    d = clustered_features(seed)
    ref = reference_knn(d["x_train"], d["y_train"], d["x_test"], d["y_test"], k, sigma)
    res = knn_classify(d["x_train"], d["y_train"], d["x_test"], d["y_test"], k=k, sigma=sigma)
    assert res.total == len(d["y_test"]) and res.k == k and res.sigma == sigma
    assert np.array_equal(res.predictions, ref["predictions"])
    assert res.top1 == pytest.approx(ref["top1"])
    assert res.top5 == pytest.approx(ref["top5"])
    assert res.top1_error == pytest.approx(100.0 - ref["top1"])
    # The fixture is neither trivial nor hopeless, so the comparison means something.
    assert 30.0 < res.top1 < 95.0 and res.top5 > res.top1


def test_neighbors_equal_sklearn_neighbors() -> None:
    d = clustered_features(3)
    ref = reference_knn(d["x_train"], d["y_train"], d["x_test"], d["y_test"], 20, 0.07)
    queries = torch.nn.functional.normalize(torch.from_numpy(d["x_test"]), dim=1)
    memory = torch.nn.functional.normalize(torch.from_numpy(d["x_train"]), dim=1)
    sims, idx = knn_neighbors(queries, memory, 20)
    assert np.array_equal(idx.numpy(), ref["neighbors"])
    assert torch.all(sims[:, :-1] >= sims[:, 1:])  # best first


def test_unnormalised_features_do_not_overflow() -> None:
    d = clustered_features(4)
    big_train, big_test = 50.0 * d["x_train"], 50.0 * d["x_test"]
    # Dot products in the thousands: exp(sim / 0.07) is inf in float32 and float64.
    assert float(np.abs(big_test @ big_train.T).max()) / 0.07 > 1000
    ref = reference_knn(big_train, d["y_train"], big_test, d["y_test"], 10, 0.07, False)
    res = knn_classify(
        big_train, d["y_train"], big_test, d["y_test"], k=10, sigma=0.07, l2_normalize=False
    )
    assert np.array_equal(res.predictions, ref["predictions"])
    assert res.top1 == pytest.approx(ref["top1"])


@pytest.mark.parametrize(("q_chunk", "m_chunk"), [(7, None), (None, 13), (7, 13), (1, 1)])
def test_chunked_equals_unchunked(q_chunk: int | None, m_chunk: int | None) -> None:
    d = clustered_features(5)
    args = (d["x_train"], d["y_train"], d["x_test"], d["y_test"])
    plain = knn_classify(*args, k=20, sigma=0.07)
    chunked = knn_classify(
        *args, k=20, sigma=0.07, query_chunk_size=q_chunk, memory_chunk_size=m_chunk
    )
    assert np.array_equal(chunked.predictions, plain.predictions)
    assert (chunked.top1, chunked.top5, chunked.k) == (plain.top1, plain.top5, plain.k)


def test_memory_chunks_give_the_same_neighbors() -> None:
    d = clustered_features(6)
    queries = torch.nn.functional.normalize(torch.from_numpy(d["x_test"]), dim=1)
    memory = torch.nn.functional.normalize(torch.from_numpy(d["x_train"]), dim=1)
    sims, idx = knn_neighbors(queries, memory, 20)
    sims_c, idx_c = knn_neighbors(queries, memory, 20, memory_chunk_size=17)
    assert torch.equal(idx_c, idx)
    assert torch.allclose(sims_c, sims)


def test_optimize_memory_path_equals_the_plain_path(monkeypatch) -> None:
    """OPTIMIZE_MEMORY's chunk sizes (auto_chunk_sizes) stream a memory bank larger than one
    memory chunk (65536) and, with a budget small enough here, several query chunks; the
    result is that of the plain path and of the reference."""
    d = clustered_features(7, n_train=70_000, n_test=40, dim=8)
    n_train = len(d["y_train"])
    assert auto_chunk_sizes(n_train, False) == (knn.DEFAULT_MEMORY_BUDGET // n_train, None)
    assert auto_chunk_sizes(n_train, True) == (knn.LOW_MEMORY_BUDGET // 65536, 65536)
    assert auto_chunk_sizes(300, True) == (knn.LOW_MEMORY_BUDGET // 300, 300)
    monkeypatch.setattr(knn, "LOW_MEMORY_BUDGET", 8 * 65536)
    q_chunk, m_chunk = auto_chunk_sizes(n_train, True)
    assert (q_chunk, m_chunk) == (8, 65536)  # 5 query chunks x 2 memory chunks
    args = (d["x_train"], d["y_train"], d["x_test"], d["y_test"])
    plain = knn_classify(*args, k=20, sigma=0.07)
    low = knn_classify(*args, k=20, sigma=0.07, query_chunk_size=q_chunk, memory_chunk_size=m_chunk)
    ref = reference_knn(*args, 20, 0.07)
    assert np.array_equal(low.predictions, plain.predictions)
    assert np.array_equal(low.predictions, ref["predictions"])
    assert (low.top1, low.top5) == (plain.top1, plain.top5)


def test_k_larger_than_the_memory_bank_uses_every_sample() -> None:
    """Documented: k is capped at the number of TRAIN samples (KnnResult.k says so)."""
    d = clustered_features(8, n_train=30, n_test=20)
    args = (d["x_train"], d["y_train"], d["x_test"], d["y_test"])
    capped = knn_classify(*args, k=1000, sigma=0.1)
    full = knn_classify(*args, k=30, sigma=0.1)
    ref = reference_knn(*args, 30, 0.1)
    assert capped.k == 30
    assert np.array_equal(capped.predictions, full.predictions)
    assert np.array_equal(capped.predictions, ref["predictions"])
    chunked = knn_classify(*args, k=1000, sigma=0.1, memory_chunk_size=7, query_chunk_size=3)
    assert np.array_equal(chunked.predictions, full.predictions)


def test_equal_votes_rank_the_lower_class_first() -> None:
    # Two TRAIN samples at the same place, of classes 3 and 1: equal votes for 3 and 1.
    train = np.array([[1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]], dtype=np.float32)
    labels = np.array([3, 1, 2])
    test = np.array([[1.0, 0.0]], dtype=np.float32)
    res = knn_classify(train, labels, test, np.array([3]), k=2, sigma=0.1, num_classes=4)
    assert res.predictions.tolist() == [[1, 3, 0, 2]]  # then the classes without votes
    assert res.top1 == 0.0 and res.top5 == 100.0


def test_few_classes_give_top5_of_100_and_short_predictions() -> None:
    rng = np.random.default_rng(9)
    train, test = rng.normal(size=(40, 4)), rng.normal(size=(10, 4))
    res = knn_classify(train, rng.integers(0, 3, 40), test, rng.integers(0, 3, 10), k=5)
    assert res.predictions.shape == (10, 3)
    assert res.top5 == 100.0


def test_labels_as_floats_or_columns_and_torch_inputs() -> None:
    d = clustered_features(10)
    plain = knn_classify(d["x_train"], d["y_train"], d["x_test"], d["y_test"], k=10)
    other = knn_classify(
        torch.from_numpy(d["x_train"]),
        d["y_train"].astype(np.float32)[:, None],
        torch.from_numpy(d["x_test"]).reshape(len(d["y_test"]), 4, 4),  # flattened
        torch.from_numpy(d["y_test"]),
        k=10,
    )
    assert np.array_equal(other.predictions, plain.predictions)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be a positive integer"),
        ({"sigma": 0.0}, "sigma must be positive"),
        ({"sigma": -1.0}, "sigma must be positive"),
    ],
)
def test_bad_settings_are_errors(kwargs: dict[str, Any], message: str) -> None:
    d = clustered_features(11, n_train=20, n_test=5)
    with pytest.raises(ValueError, match=message):
        knn_classify(d["x_train"], d["y_train"], d["x_test"], d["y_test"], **kwargs)


def test_bad_inputs_are_errors() -> None:
    d = clustered_features(12, n_train=20, n_test=5)
    with pytest.raises(ValueError, match="at least one TRAIN and one TEST"):
        knn_classify(d["x_train"][:0], d["y_train"][:0], d["x_test"], d["y_test"])
    with pytest.raises(ValueError, match="differ in length"):
        knn_classify(d["x_train"], d["y_train"][:-1], d["x_test"], d["y_test"])
    with pytest.raises(ValueError, match="feature sizes differ"):
        knn_classify(d["x_train"], d["y_train"], d["x_test"][:, :8], d["y_test"])
    with pytest.raises(ValueError, match="empty"):
        knn_neighbors(torch.ones(2, 3), torch.ones(0, 3), 5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m_chunk", [None, 37])
def test_cuda_equals_cpu(m_chunk: int | None) -> None:
    d = clustered_features(13, n_train=2000, n_test=500, dim=64)
    args = (d["x_train"], d["y_train"], d["x_test"], d["y_test"])
    cpu = knn_classify(*args, k=20, sigma=0.07)
    gpu = knn_classify(
        *args, k=20, sigma=0.07, device="cuda", query_chunk_size=64, memory_chunk_size=m_chunk
    )
    ref = reference_knn(*args, 20, 0.07)
    assert np.array_equal(gpu.predictions, cpu.predictions)
    assert np.array_equal(gpu.predictions, ref["predictions"])
    assert (gpu.top1, gpu.top5) == (cpu.top1, cpu.top5)

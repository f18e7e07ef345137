"""Weighted k-nearest-neighbour classification of features (InstDisc / DINO kNN probe).

Every TEST feature (query) finds its ``k`` most similar TRAIN features (memory bank) by dot
product (cosine similarity when the features are L2-normalised); each neighbour votes for
its class with weight ``exp(similarity / sigma)``; classes are ranked by their summed
votes (ties: lower class index first). ``k`` above the number of TRAIN samples means all
of them. TRAIN samples exactly tied in similarity at the ``k``-th place are chosen as
``torch.topk`` chooses (features in general position have no such ties).

    result = knn_classify(train_feats, train_labels, test_feats, test_labels, k=20, sigma=0.07)
    print(result.top1, result.top5)

Memory is bounded by chunking: queries are processed ``query_chunk_size`` at a time, and
with ``memory_chunk_size`` the memory bank is streamed in chunks (kept on the CPU, moved to
the device one chunk at a time) with a running top-k merge, so that at most
``query_chunk_size x memory_chunk_size`` similarities exist at once. Results do not depend
on the chunk sizes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

#: Similarities held at once by :func:`auto_chunk_sizes` when memory is optimised (floats).
LOW_MEMORY_BUDGET = 32 * 1024 * 1024
#: Similarities held at once otherwise (floats): 1 GiB of float32.
DEFAULT_MEMORY_BUDGET = 256 * 1024 * 1024


@dataclass(frozen=True)
class KnnResult:
    """Outcome of :func:`knn_classify`.

    Attributes:
        top1: top-1 accuracy in percent.
        top5: top-5 accuracy in percent (100 when there are at most 5 classes).
        total: number of queries.
        k: neighbours that voted (``min(k, len(train))``).
        sigma: temperature of the votes.
        predictions: ``(total, min(5, num_classes))`` class indices, best first.
    """

    top1: float
    top5: float
    total: int
    k: int
    sigma: float
    predictions: np.ndarray

    @property
    def top1_error(self) -> float:
        """Top-1 error in percent."""
        return 100.0 - self.top1


def _as_float_tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.ndim == 1:  # one value per sample
        t = t[:, None]
    # flatten, not reshape(n, -1): the latter fails on an empty (0, D) array
    return t.flatten(1).float()


def _as_labels(y: np.ndarray | torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(y).reshape(-1)
    if t.is_floating_point():
        t = t.round()
    return t.long()


def auto_chunk_sizes(num_train: int, optimize_memory: bool) -> tuple[int, int | None]:
    """``(query_chunk_size, memory_chunk_size)`` keeping the similarity block bounded.

    Without ``optimize_memory`` the whole memory bank sits on the device and queries go
    in chunks of ``DEFAULT_MEMORY_BUDGET / num_train``; with it the bank is streamed in
    chunks of at most 65536 and ``LOW_MEMORY_BUDGET`` bounds the block.
    """
    num_train = max(int(num_train), 1)
    if not optimize_memory:
        return max(1, DEFAULT_MEMORY_BUDGET // num_train), None
    memory_chunk = min(num_train, 65536)
    return max(1, LOW_MEMORY_BUDGET // memory_chunk), memory_chunk


def _merge_topk(
    best: tuple[torch.Tensor, torch.Tensor] | None,
    sims: torch.Tensor,
    idx: torch.Tensor,
    k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    if best is None:
        return sims, idx
    all_sims = torch.cat([best[0], sims], dim=1)
    all_idx = torch.cat([best[1], idx], dim=1)
    top, pos = all_sims.topk(min(k, all_sims.shape[1]), dim=1)
    return top, all_idx.gather(1, pos)


def knn_neighbors(
    queries: torch.Tensor,
    memory: torch.Tensor,
    k: int,
    memory_chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Similarities and indices of the ``k`` most similar rows of ``memory``, best first.

    ``queries`` are on the compute device; ``memory`` may stay on the CPU when
    ``memory_chunk_size`` is given (each chunk is moved to the queries' device).
    """
    n_mem = memory.shape[0]
    if n_mem == 0:
        raise ValueError("knn_neighbors: the memory bank is empty")
    k = min(k, n_mem)
    chunk = n_mem if not memory_chunk_size else int(memory_chunk_size)
    best: tuple[torch.Tensor, torch.Tensor] | None = None
    for start in range(0, n_mem, chunk):
        block = memory[start : start + chunk].to(queries.device, non_blocking=True)
        sims = queries @ block.T
        top, idx = sims.topk(min(k, sims.shape[1]), dim=1)
        best = _merge_topk(best, top, idx + start, k)
    if best is None:  # unreachable: the bank is not empty
        raise ValueError("knn_neighbors: the memory bank is empty")
    return best


def knn_class_scores(
    sims: torch.Tensor, neighbor_labels: torch.Tensor, num_classes: int, sigma: float
) -> torch.Tensor:
    """Summed votes ``exp(sim / sigma)`` per class, ``(queries, num_classes)``.

    The votes of a query are scaled by ``exp(-max_sim / sigma)`` (one positive factor per
    query): the ranking is that of ``exp(sim / sigma)``, without overflow for large
    un-normalised similarities.
    """
    shifted = (sims - sims[:, :1]) / sigma  # sims are sorted: column 0 is the maximum
    weights = shifted.exp()
    scores = torch.zeros(sims.shape[0], num_classes, dtype=weights.dtype, device=sims.device)
    return scores.scatter_add_(1, neighbor_labels, weights)


def rank_classes(scores: torch.Tensor) -> torch.Tensor:
    """Class indices by decreasing score; equal scores keep the lower class first."""
    return torch.sort(scores, dim=1, descending=True, stable=True).indices


def knn_classify(
    train_features: np.ndarray | torch.Tensor,
    train_labels: np.ndarray | torch.Tensor,
    test_features: np.ndarray | torch.Tensor,
    test_labels: np.ndarray | torch.Tensor,
    *,
    k: int = 20,
    sigma: float = 0.07,
    l2_normalize: bool = True,
    num_classes: int | None = None,
    query_chunk_size: int | None = None,
    memory_chunk_size: int | None = None,
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> KnnResult:
    """Weighted kNN classification of ``test_features`` by ``train_features``.

    Args:
        train_features: ``(N, D)`` memory bank (any trailing shape is flattened).
        train_labels: ``(N,)`` class indices.
        test_features: ``(M, D)`` queries.
        test_labels: ``(M,)`` class indices.
        k: neighbours that vote (capped at ``N``).
        sigma: temperature of the votes ``exp(sim / sigma)``.
        l2_normalize: L2-normalise both feature sets first (cosine similarity).
        num_classes: number of classes (default: ``max label + 1``).
        query_chunk_size: queries per chunk (default: all at once).
        memory_chunk_size: stream the memory bank in chunks of this size (default: the
            whole bank on ``device``).
        device: where similarities are computed (``cpu``, ``cuda``, ...).
        progress: show a tqdm bar over query chunks.

    Raises:
        ValueError: ``k`` or ``sigma`` not positive, empty or mismatched inputs.
    """
    if int(k) < 1:
        raise ValueError(f"k must be a positive integer; got {k!r}")
    if not float(sigma) > 0:
        raise ValueError(f"sigma must be positive; got {sigma!r}")
    train = _as_float_tensor(train_features)
    test = _as_float_tensor(test_features)
    y_train, y_test = _as_labels(train_labels), _as_labels(test_labels)
    if train.shape[0] == 0 or test.shape[0] == 0:
        raise ValueError("knn_classify needs at least one TRAIN and one TEST feature")
    if train.shape[0] != y_train.shape[0] or test.shape[0] != y_test.shape[0]:
        raise ValueError(
            f"features and labels differ in length: TRAIN {train.shape[0]} vs "
            f"{y_train.shape[0]}, TEST {test.shape[0]} vs {y_test.shape[0]}"
        )
    if train.shape[1] != test.shape[1]:
        raise ValueError(f"feature sizes differ: TRAIN {train.shape[1]}, TEST {test.shape[1]}")
    n_cls = int(num_classes or max(int(y_train.max()), int(y_test.max())) + 1)
    if l2_normalize:
        train, test = F.normalize(train, dim=1), F.normalize(test, dim=1)
    device = torch.device(device)
    if not memory_chunk_size:
        train = train.to(device)
    y_train_dev = y_train.to(device)
    k_eff = min(int(k), train.shape[0])
    n_test = test.shape[0]
    q_chunk = int(query_chunk_size or n_test)
    top1 = top5 = 0
    preds: list[np.ndarray] = []
    starts: Iterable[int] = range(0, n_test, q_chunk)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, total=math.ceil(n_test / q_chunk), desc="kNN", unit="chunk")
    with torch.no_grad():
        for start in starts:
            queries = test[start : start + q_chunk].to(device)
            targets = y_test[start : start + q_chunk].to(device)
            sims, idx = knn_neighbors(queries, train, k_eff, memory_chunk_size)
            scores = knn_class_scores(sims, y_train_dev[idx], n_cls, float(sigma))
            ranked = rank_classes(scores)[:, : min(5, n_cls)]
            hits = ranked.eq(targets[:, None])
            top1 += int(hits[:, 0].sum())
            top5 += int(hits.any(dim=1).sum())
            preds.append(ranked.cpu().numpy())
    return KnnResult(
        top1=100.0 * top1 / n_test,
        top5=100.0 * top5 / n_test,
        total=n_test,
        k=k_eff,
        sigma=float(sigma),
        predictions=np.concatenate(preds),
    )

"""VISSL's low-shot SVM benchmark on VOC07 (``tools/train_svm_low_shot.py``).

For each independent draw ``s`` of ``SVM.low_shot.sample_inds`` and each ``k`` of
``SVM.low_shot.k_values``, the TRAIN targets are reduced to ``k`` positives and
``(C - 1) * k`` negatives per class, drawn among that class's positives (1) and negatives
(0); every other entry becomes -1 (not used). For each class and each cost of
``SVM.costs`` a linear SVM (VISSL's ``LinearSVC`` settings, :func:`make_svm`) is trained on
that class's drawn samples and scored on the full TEST split: the AP of the class
(interpolated, difficult -1 samples left out), averaged over the classes. Per ``k``, the
mean / min / max / std over the draws of that average are reported at the cost whose mean
is highest, in percent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vissl.errors import ConfigError
from vissl.evaluation.svm import SvmSettings, interpolated_ap, make_svm, normalize_features

_KEY = "config.SVM.low_shot"


def low_shot_targets(targets: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``(N, C)`` targets with ``k`` positives and ``(C - 1) * k`` negatives per class kept
    (drawn without replacement), -1 elsewhere.

    Raises:
        ConfigError: a class has fewer than ``k`` positives or ``(C - 1) * k`` negatives.
    """
    y = np.asarray(targets)
    if y.ndim != 2:
        raise ConfigError(
            f"{_KEY}.dataset_name=voc needs (N, C) multi-label TRAIN targets (1 present, 0 "
            f"absent, -1 ignored), got shape {y.shape}; extract them with VOC07 label files.",
            f"{_KEY}.dataset_name",
        )
    n_classes = y.shape[1]
    out = np.full(y.shape, -1, dtype=np.int32)
    for symbol, count in ((1, k), (0, (n_classes - 1) * k)):
        for c in range(n_classes):
            rows = np.flatnonzero(y[:, c] == symbol)
            if len(rows) < count:
                what = "positives" if symbol == 1 else "negatives"
                raise ConfigError(
                    f"{_KEY}.k_values: k={k} needs {count} {what} of class {c} in TRAIN, "
                    f"there are {len(rows)}; use smaller k values.",
                    f"{_KEY}.k_values",
                )
            out[rng.choice(rows, size=count, replace=False), c] = symbol
    return out


def class_aps_by_cost(
    train_x: np.ndarray,
    train_targets: np.ndarray,
    test_x: np.ndarray,
    test_targets: np.ndarray,
    settings: SvmSettings,
) -> np.ndarray:
    """``(C, #costs)``: each class's TEST AP for an SVM trained on its non -1 TRAIN rows."""
    xtr = normalize_features(train_x) if settings.normalize else np.asarray(train_x, np.float64)
    xte = normalize_features(test_x) if settings.normalize else np.asarray(test_x, np.float64)
    xtr = xtr.reshape(len(xtr), -1)
    xte = xte.reshape(len(xte), -1)
    n_classes = train_targets.shape[1]
    aps = np.zeros((n_classes, len(settings.costs)))
    for c in range(n_classes):
        rows = train_targets[:, c] != -1
        y = np.where(train_targets[rows, c] == 1, 1, -1)
        counted = test_targets[:, c] != -1
        for j, cost in enumerate(settings.costs):
            svm = make_svm(cost, settings).fit(xtr[rows], y)
            scores = svm.decision_function(xte[counted])
            aps[c, j] = interpolated_ap(scores, test_targets[counted, c] == 1)
    return aps


@dataclass(frozen=True)
class LowShotStats:
    """Per ``k``: the mean, min, max and std (percent) over the draws at the best cost."""

    k: int
    cost: float
    mean: float
    min: float
    max: float
    std: float


def aggregate(
    mean_aps: np.ndarray, k_values: Sequence[int], costs: Sequence[float]
) -> tuple[list[LowShotStats], dict[str, np.ndarray]]:
    """Reduce ``(#k, #draws, #costs)`` class-averaged APs (fractions) to VISSL's stats.

    Returns:
        The per-``k`` stats at the cost of highest mean, and the ``(#k, #costs)`` mean /
        min / max / std matrices (VISSL's ``test_ap_{stat}.npy``).
    """
    matrices = {
        "mean": mean_aps.mean(axis=1),
        "min": mean_aps.min(axis=1),
        "max": mean_aps.max(axis=1),
        "std": mean_aps.std(axis=1),
    }
    stats = []
    for i, k in enumerate(k_values):
        best = int(np.argmax(matrices["mean"][i]))
        stats.append(
            LowShotStats(
                k=int(k),
                cost=float(costs[best]),
                **{name: round(100.0 * float(m[i, best]), 2) for name, m in matrices.items()},
            )
        )
    return stats, matrices

"""Low-shot benchmark on extracted features (VISSL's ``LOW_SHOT_BENCHMARK`` keys).

For each number ``k`` of samples per class and each seed, ``k`` TRAIN samples of every
class are drawn (:func:`sample_low_shot_indices`), a linear classifier is trained on them
alone, and its top-1 accuracy is measured on all of TEST. A result is the mean and the
standard deviation over the seeds.

- ``logistic_regression`` (as VISSL's ``low_shot_utils``): features standardised with the
  mean and deviation of the drawn samples (scikit-learn ``StandardScaler``), then a
  multinomial L2 logistic regression of strength ``LAMBDA`` (scikit-learn
  ``C = n_samples / LAMBDA``).
- ``svm``: one-vs-rest linear SVMs as VISSL's SVM benchmark (:mod:`vissl.evaluation.svm`,
  the ``SVM`` section) on the drawn samples, all at one cost, the one of best mean
  cross-validated AP over the classes (a cost per class, as the SVM benchmark picks, makes
  the class scores incomparable: top-1 fell below that of one sample per class); a TEST
  sample goes to the class whose SVM scores highest.

With several ``LAMBDA`` values, the one of best cross-validated accuracy on the drawn
samples is used (VISSL reported the best TEST accuracy over them, which peeks at TEST);
with one sample per class nothing can be cross-validated and the first value is used.
The SVM picks its cost likewise, by AP (:func:`vissl.evaluation.svm.train_svms`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vissl.evaluation.svm import SvmSettings, evaluate_svms, train_svms

logger = logging.getLogger(__name__)

METHODS = ("logistic_regression", "svm")


@dataclass(frozen=True)
class LowShotResult:
    """Top-1 accuracies (percent) of the draws with ``k`` samples per class.

    ``chosen[i]``: what draw ``i`` used, its ``LAMBDA`` (logistic regression) or its
    cost (svm); ``mean_aps[i]``: its TEST mAP (svm only, VISSL's measure).
    """

    k: int
    seeds: tuple[int, ...]
    accuracies: tuple[float, ...]
    chosen: tuple[float, ...] = ()
    mean_aps: tuple[float, ...] = ()

    @property
    def mean(self) -> float:
        """Mean top-1 over the draws."""
        return float(np.mean(self.accuracies))

    @property
    def std(self) -> float:
        """Standard deviation of top-1 over the draws (population; 0 for one draw)."""
        return float(np.std(self.accuracies))


def _check_k_and_seed(k: Any, seed: Any) -> None:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"samples per class must be an integer >= 1; got {k!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed < 2**32:
        raise ValueError(f"a low-shot seed must be an integer in [0, 2**32); got {seed!r}")


def sample_low_shot_indices(labels: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Sorted indices of ``k`` samples of every class, drawn without replacement.

    Each class's samples are shuffled by ``np.random.RandomState(seed)`` (classes in
    sorted order) and the first ``k`` taken, so a draw is deterministic per seed and, for
    one seed, the draw of a smaller ``k`` is part of the draw of a larger one.

    Raises:
        ValueError: ``k`` < 1, a seed out of ``[0, 2**32)``, labels that are not ``(N,)``,
            or a class with fewer than ``k`` samples.
    """
    _check_k_and_seed(k, seed)
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"low-shot sampling needs (N,) class labels; got shape {y.shape}")
    rng = np.random.RandomState(seed)
    picked = []
    for cls in np.unique(y):
        members = np.flatnonzero(y == cls)
        if len(members) < k:
            raise ValueError(
                f"class {cls} has {len(members)} TRAIN samples, fewer than the {k} per class "
                "asked for"
            )
        picked.append(rng.permutation(members)[: int(k)])
    return np.sort(np.concatenate(picked))


def max_samples_per_class(labels: np.ndarray) -> int:
    """The largest ``k`` every class can give (the size of the smallest class)."""
    _, counts = np.unique(np.asarray(labels).reshape(-1), return_counts=True)
    return int(counts.min()) if len(counts) else 0


def _fit_logistic_regression(x: np.ndarray, y: np.ndarray, lam: float) -> Any:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(
        StandardScaler(), LogisticRegression(C=len(y) / float(lam), max_iter=1000)
    ).fit(x, y)


def choose_lambda(x: np.ndarray, y: np.ndarray, lambdas: Sequence[float], seed: int) -> float:
    """The ``LAMBDA`` of best stratified cross-validated accuracy on ``(x, y)`` (the first
    listed among equals; the first one when a class has a single sample)."""
    from sklearn.model_selection import StratifiedKFold

    _, counts = np.unique(y, return_counts=True)
    n_splits = min(3, int(counts.min()))
    if len(lambdas) == 1 or n_splits < 2:
        return float(lambdas[0])
    folds = list(StratifiedKFold(n_splits, shuffle=True, random_state=seed).split(x, y))
    scores = []
    for lam in lambdas:
        accs = [
            float((_fit_logistic_regression(x[tr], y[tr], lam).predict(x[va]) == y[va]).mean())
            for tr, va in folds
        ]
        scores.append(float(np.mean(accs)))
    return float(lambdas[int(np.argmax(scores))])


def _logistic_regression_top1(
    x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, lam: float
) -> float:
    clf = _fit_logistic_regression(x, y, lam)
    return 100.0 * float((clf.predict(x_test) == y_test).mean())


def run_low_shot(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    test_features: np.ndarray,
    test_labels: np.ndarray,
    *,
    samples_per_class: Sequence[int],
    seeds: Sequence[int],
    method: str = "logistic_regression",
    lambdas: Sequence[float] = (0.1,),
    svm_settings: SvmSettings | None = None,
    progress: bool = False,
    desc: str = "low-shot",
) -> list[LowShotResult]:
    """Low-shot top-1 for every ``k`` in ``samples_per_class``, one draw per seed.

    Args:
        lambdas: ``LAMBDA`` values of the logistic regression.
        svm_settings: the SVMs of ``method="svm"`` (default :class:`SvmSettings`; its
            ``cls_list`` restricts the classes and the TEST samples counted).
        progress: show a progress bar over the draws.

    Raises:
        ValueError: an unknown method, no seed / ``LAMBDA`` / ``k``, a bad seed or ``k``,
            labels that are not ``(N,)`` or not as many as the features, fewer than 2
            TRAIN classes, a ``cls_list`` class without TRAIN or TEST samples, or a class
            with fewer TRAIN samples than a ``k`` (all checked before the first draw).
    """
    from sklearn.exceptions import ConvergenceWarning

    if method not in METHODS:
        raise ValueError(f"unknown low-shot method {method!r}; use one of {list(METHODS)}")
    if not seeds or not samples_per_class or (method == "logistic_regression" and not lambdas):
        raise ValueError("low-shot needs at least one seed, one k and one LAMBDA")
    x_train = np.asarray(train_features).reshape(len(train_features), -1)
    x_test = np.asarray(test_features).reshape(len(test_features), -1)
    y_train = np.asarray(train_labels)
    y_test = np.asarray(test_labels)
    if y_train.ndim != 1 or y_test.ndim != 1:
        raise ValueError(
            "the low-shot benchmark needs single-label (N,) targets; got shapes "
            f"{y_train.shape} (TRAIN) and {y_test.shape} (TEST)"
        )
    for name, x, y in (("TRAIN", x_train, y_train), ("TEST", x_test, y_test)):
        if len(x) != len(y):
            raise ValueError(f"{len(x)} {name} features but {len(y)} labels")
    for k in samples_per_class:
        for s in seeds:
            _check_k_and_seed(k, s)
    train_classes = np.unique(y_train)
    if len(train_classes) < 2:
        raise ValueError(
            f"the TRAIN labels have {len(train_classes)} class; a classifier needs at least 2"
        )
    smallest = max_samples_per_class(y_train)
    if max(samples_per_class) > smallest:
        raise ValueError(
            f"{max(samples_per_class)} samples per class asked for, but the smallest TRAIN "
            f"class has {smallest}"
        )
    settings = svm_settings or SvmSettings()
    if method == "svm":
        missing = [c for c in settings.cls_list if c not in train_classes]
        if missing:
            raise ValueError(f"SVM.cls_list: no TRAIN sample of class {missing}")
        svm_cls = list(settings.cls_list) or train_classes.tolist()
        if not np.isin(y_test, svm_cls).any():
            raise ValueError(f"no TEST sample of the SVMs' classes {svm_cls}")
    ks = list(dict.fromkeys(int(k) for k in samples_per_class))
    jobs = [(k, int(s)) for k in ks for s in seeds]
    iterator: Any = jobs
    if progress:
        from tqdm import tqdm

        iterator = tqdm(jobs, desc=desc, unit="draw")
    accs: dict[int, list[float]] = {k: [] for k in ks}
    chosen: dict[int, list[float]] = {k: [] for k in ks}
    mean_aps: dict[int, list[float]] = {k: [] for k in ks}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for k, seed in iterator:
            idx = sample_low_shot_indices(y_train, k, seed)
            x, y = x_train[idx], y_train[idx]
            used: float
            if method == "logistic_regression":
                used = choose_lambda(x, y, lambdas, seed)
                acc = _logistic_regression_top1(x, y, x_test, y_test, used)
            else:
                model = train_svms(
                    x, y, settings, shared_cost=True, desc=f"{desc} k={k}", verbose=False
                )
                result = evaluate_svms(model, x_test, y_test)
                acc, used = float(result.top1 or 0.0), model.chosen_costs[0]
                mean_aps[k].append(result.mean_ap)
            logger.info("%s k=%d seed=%d (%s %s): top-1 %.2f%%", desc, k, seed, method, used, acc)
            accs[k].append(acc)
            chosen[k].append(used)
    return [
        LowShotResult(
            k=k,
            seeds=tuple(int(s) for s in seeds),
            accuracies=tuple(accs[k]),
            chosen=tuple(chosen[k]),
            mean_aps=tuple(mean_aps[k]),
        )
        for k in accs
    ]

"""vissl.evaluation.low_shot: drawing k samples per class, the low-shot classifiers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from vissl.evaluation import low_shot as low_shot_utils
from vissl.evaluation.low_shot import (
    LowShotResult,
    choose_lambda,
    max_samples_per_class,
    run_low_shot,
    sample_low_shot_indices,
)
from vissl.evaluation.svm import SvmSettings

LABELS = np.array([3] * 7 + [0] * 5 + [1] * 9 + [3] * 2 + [2] * 6)  # 9 of class 3


def _shuffled(labels: np.ndarray, seed: int) -> np.ndarray:
    return labels[np.random.RandomState(seed).permutation(len(labels))]


# ----------------------------------------------------------------------------- draws
@pytest.mark.parametrize("k", [1, 2, 5])
def test_k_distinct_samples_of_every_class(k: int) -> None:
    y = _shuffled(LABELS, 0)
    idx = sample_low_shot_indices(y, k, seed=0)
    assert idx.dtype.kind == "i"
    assert np.array_equal(idx, np.sort(idx))
    assert len(np.unique(idx)) == len(idx) == 4 * k  # no sample twice
    assert ((idx >= 0) & (idx < len(y))).all()
    classes, counts = np.unique(y[idx], return_counts=True)
    assert classes.tolist() == [0, 1, 2, 3]
    assert counts.tolist() == [k] * 4


def test_draws_are_deterministic_per_seed_and_differ_between_seeds() -> None:
    y = _shuffled(LABELS, 1)
    draws = {seed: sample_low_shot_indices(y, 3, seed) for seed in range(6)}
    for seed, idx in draws.items():
        assert np.array_equal(sample_low_shot_indices(y, 3, seed), idx)
    assert len({tuple(idx.tolist()) for idx in draws.values()}) == len(draws)
    # a smaller k of the same seed is part of the larger draw
    for seed in range(3):
        small, large = sample_low_shot_indices(y, 2, seed), sample_low_shot_indices(y, 5, seed)
        assert set(small.tolist()) <= set(large.tolist())


def test_draws_cover_the_class_uniformly() -> None:
    """Over many seeds, every sample of a class is drawn about equally often."""
    y = np.repeat([0, 1], 10)
    counts = np.zeros(len(y))
    for seed in range(2000):
        counts[sample_low_shot_indices(y, 2, seed)] += 1
    np.testing.assert_allclose(counts / 2000, 0.2, atol=0.04)


def test_too_few_samples_or_bad_arguments() -> None:
    y = _shuffled(LABELS, 2)
    assert max_samples_per_class(y) == 5
    sample_low_shot_indices(y, 5, 0)
    with pytest.raises(ValueError, match="class 0 has 5 TRAIN samples, fewer than the 6"):
        sample_low_shot_indices(y, 6, 0)
    for bad_k in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="samples per class must be an integer >= 1"):
            sample_low_shot_indices(y, bad_k, 0)  # type: ignore[arg-type]
    for bad_seed in (-1, 2**32, 0.5):
        with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*32\)"):
            sample_low_shot_indices(y, 1, bad_seed)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\(N,\) class labels"):
        sample_low_shot_indices(np.zeros((4, 2)), 1, 0)
    assert max_samples_per_class(np.array([], dtype=int)) == 0


# ----------------------------------------------------------------------- classifiers
def _clusters(
    n_per_class: int, n_classes: int, dim: int, seed: int, noise: float = 0.1
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(seed)
    y = np.repeat(np.arange(n_classes), n_per_class)
    x = np.eye(dim)[y] * 3.0 + rng.randn(len(y), dim) * noise
    perm = rng.permutation(len(y))
    return x[perm].astype(np.float32), y[perm]


@pytest.mark.parametrize("method", ["logistic_regression", "svm"])
def test_separable_classes_are_learnt_from_one_sample_each(method: str) -> None:
    # no noise-only dimension: standardised on a few samples (as VISSL), it would weigh
    # as much as the informative ones
    x_train, y_train = _clusters(12, 5, 5, seed=0)
    x_test, y_test = _clusters(20, 5, 5, seed=1)
    results = run_low_shot(
        x_train,
        y_train,
        x_test,
        y_test,
        samples_per_class=[1, 3, 1],  # repeats dropped
        seeds=[0, 1, 2],
        method=method,
        lambdas=[0.1, 1.0],
        svm_settings=SvmSettings(costs=(0.1, 1.0)),
    )
    assert [r.k for r in results] == [1, 3]
    for r in results:
        assert r.seeds == (0, 1, 2)
        assert r.accuracies == (100.0, 100.0, 100.0)
        assert (r.mean, r.std) == (100.0, 0.0)
        assert len(r.chosen) == 3
        assert len(r.mean_aps) == (3 if method == "svm" else 0)
    if method == "svm":
        assert all(ap == pytest.approx(100.0) for r in results for ap in r.mean_aps)
        assert all(c in (0.1, 1.0) for r in results for c in r.chosen)
    else:
        assert results[0].chosen == (0.1, 0.1, 0.1)  # k=1: nothing to cross-validate


@pytest.mark.parametrize("method", ["logistic_regression", "svm"])
def test_random_labels_give_chance(method: str) -> None:
    rng = np.random.RandomState(3)
    x_train, y_train = rng.randn(200, 16), np.repeat(np.arange(4), 50)
    x_test, y_test = rng.randn(2000, 16), rng.randint(0, 4, 2000)
    (result,) = run_low_shot(
        x_train,
        y_train,
        x_test,
        y_test,
        samples_per_class=[10],
        seeds=[0, 1, 2, 3],
        method=method,
        svm_settings=SvmSettings(costs=(1.0,)),
    )
    assert 20.0 < result.mean < 30.0


def test_logistic_regression_draw_is_an_independent_fit() -> None:
    """Each accuracy is that of scikit-learn's standardised multinomial logistic
    regression (C = n / LAMBDA, as VISSL) trained on the seed's draw from TRAIN alone."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    x_train, y_train = _clusters(15, 4, 6, seed=4, noise=1.2)
    x_test, y_test = _clusters(30, 4, 6, seed=5, noise=1.2)
    (result,) = run_low_shot(
        x_train,
        y_train,
        x_test,
        y_test,
        samples_per_class=[2],
        seeds=[7, 8],
        lambdas=[0.5],
    )
    for seed, acc in zip((7, 8), result.accuracies, strict=True):
        idx = sample_low_shot_indices(y_train, 2, seed)
        scaler = StandardScaler().fit(x_train[idx])
        clf = LogisticRegression(C=len(idx) / 0.5, max_iter=1000).fit(
            scaler.transform(x_train[idx]), y_train[idx]
        )
        expected = 100.0 * (clf.predict(scaler.transform(x_test)) == y_test).mean()
        assert acc == pytest.approx(expected)
    assert result.chosen == (0.5, 0.5)
    assert 0.0 < result.mean < 100.0
    assert result.std == pytest.approx(np.std(result.accuracies))


def test_choose_lambda_maximises_cross_validated_accuracy() -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = _clusters(6, 3, 5, seed=6, noise=1.5)
    lambdas = [1e-3, 1.0, 1e3]
    chosen = choose_lambda(x, y, lambdas, seed=0)
    scores = [
        cross_val_score(
            make_pipeline(StandardScaler(), LogisticRegression(C=len(y) / lam, max_iter=1000)),
            x,
            y,
            cv=StratifiedKFold(3, shuffle=True, random_state=0),
        ).mean()
        for lam in lambdas
    ]
    assert chosen == lambdas[int(np.argmax(scores))]
    # one sample per class, or a single LAMBDA: the first one
    assert choose_lambda(x[:3], np.array([0, 1, 2]), lambdas, seed=0) == 1e-3
    assert choose_lambda(x, y, [5.0], seed=0) == 5.0


def test_run_low_shot_errors() -> None:
    x, y = _clusters(4, 3, 5, seed=7)
    common = {"samples_per_class": [1], "seeds": [0]}
    with pytest.raises(ValueError, match="5 samples per class asked for, but the smallest TRAIN"):
        run_low_shot(x, y, x, y, samples_per_class=[1, 5], seeds=[0])
    with pytest.raises(ValueError, match="unknown low-shot method 'knn'"):
        run_low_shot(x, y, x, y, method="knn", **common)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one seed"):
        run_low_shot(x, y, x, y, samples_per_class=[1], seeds=[])
    with pytest.raises(ValueError, match="single-label"):
        run_low_shot(x, np.eye(3)[y], x, y, **common)  # type: ignore[arg-type]


def test_run_low_shot_checks_everything_before_the_first_draw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bad arguments or data fail at once (no draw trained, no progress bar left)."""

    def no_draw(*args: object, **kwargs: object) -> None:
        raise AssertionError("a draw was made")

    monkeypatch.setattr(low_shot_utils, "sample_low_shot_indices", no_draw)
    x, y = _clusters(4, 3, 5, seed=7)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"seeds": [0, -1]}, r"seed must be an integer in \[0, 2\*\*32\)"),
        ({"samples_per_class": [1, 0]}, "samples per class must be an integer >= 1"),
        ({"train_labels": y[:-1]}, "12 TRAIN features but 11 labels"),
        ({"test_labels": y[:-1]}, "12 TEST features but 11 labels"),
        ({"train_labels": np.zeros_like(y)}, "the TRAIN labels have 1 class"),
        (
            {"method": "svm", "svm_settings": SvmSettings(costs=(1.0,), cls_list=(1, 42))},
            r"SVM.cls_list: no TRAIN sample of class \[42\]",
        ),
        (
            {"method": "svm", "test_labels": y + 10},
            r"no TEST sample of the SVMs' classes \[0, 1, 2\]",
        ),
    ]
    for extra, message in cases:
        kwargs: dict[str, Any] = {
            "train_features": x,
            "train_labels": y,
            "test_features": x,
            "test_labels": y,
            "samples_per_class": [1],
            "seeds": [0],
            **extra,
        }
        with pytest.raises(ValueError, match=message):
            run_low_shot(**kwargs)


def test_never_trains_on_test_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """The classifier sees only drawn TRAIN rows (TEST is scored, never fitted)."""
    x_train, y_train = _clusters(6, 3, 5, seed=8)
    x_test, y_test = _clusters(6, 3, 5, seed=9)
    fitted: list[np.ndarray] = []
    real_fit = low_shot_utils._fit_logistic_regression

    def spy(x: np.ndarray, y: np.ndarray, lam: float) -> object:
        fitted.append(np.asarray(x))
        return real_fit(x, y, lam)

    monkeypatch.setattr(low_shot_utils, "_fit_logistic_regression", spy)
    run_low_shot(x_train, y_train, x_test, y_test, samples_per_class=[2], seeds=[0, 1])
    train_rows = {row.tobytes() for row in x_train.astype(np.float32)}
    assert fitted and all(len(f) == 6 for f in fitted)
    assert all(row.tobytes() in train_rows for f in fitted for row in f.astype(np.float32))


def test_result_statistics() -> None:
    r = LowShotResult(k=2, seeds=(0, 1), accuracies=(50.0, 70.0))
    assert (r.mean, r.std) == (60.0, 10.0)  # population standard deviation, as VISSL

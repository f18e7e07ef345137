"""vissl.evaluation.svm: average precision, VISSL's LinearSVC set-up, the cost sweep.

The APs are checked against formulas written here from their definitions (exact integer
arithmetic for the recall thresholds) and against scikit-learn.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vissl.errors import ConfigError
from vissl.evaluation import svm as svm_utils
from vissl.evaluation.svm import (
    SvmSettings,
    binary_targets,
    cross_validated_ap,
    evaluate_svms,
    interpolated_ap,
    make_svm,
    normalize_features,
    svm_classes,
    svm_costs,
    train_svms,
    voc07_11point_ap,
)


# ----------------------------------------------------------------- reference APs
def _ranked_hits(scores: np.ndarray, positives: np.ndarray) -> list[bool]:
    """Targets ranked by decreasing score (distinct scores in these tests)."""
    assert len(set(np.asarray(scores).tolist())) == len(scores), "ties are not ranked here"
    return [bool(positives[i]) for i in sorted(range(len(scores)), key=lambda i: -scores[i])]


def _precision_recall_fractions(hits: list[bool]) -> list[tuple[Fraction, Fraction]]:
    """(precision, recall) after each ranked sample, as exact fractions."""
    n_pos, tp, out = sum(hits), 0, []
    for rank, hit in enumerate(hits, start=1):
        tp += hit
        out.append((Fraction(tp, rank), Fraction(tp, n_pos)))
    return out


def reference_11point_ap(scores: np.ndarray, positives: np.ndarray) -> float:
    """VOC07: (1/11) sum over t in {0, 0.1, ..., 1} of max{precision : recall >= t}."""
    pr = _precision_recall_fractions(_ranked_hits(scores, positives))
    total = Fraction(0)
    for i in range(11):
        reached = [p for p, r in pr if r >= Fraction(i, 10)]
        total += max(reached) if reached else 0
    return float(total / 11)


def reference_interpolated_ap(scores: np.ndarray, positives: np.ndarray) -> float:
    """Area under the interpolated curve: the mean over the positives of the highest
    precision at that positive's rank or below (VISSL's ``calculate_ap``)."""
    hits = _ranked_hits(scores, positives)
    pr = _precision_recall_fractions(hits)
    per_positive = [max(p for p, _ in pr[k:]) for k, hit in enumerate(hits) if hit]
    return float(sum(per_positive) / len(per_positive))


def reference_plain_ap(scores: np.ndarray, positives: np.ndarray) -> float:
    """Non-interpolated AP: the mean precision at the ranks of the positives."""
    hits = _ranked_hits(scores, positives)
    pr = _precision_recall_fractions(hits)
    per_positive = [pr[k][0] for k, hit in enumerate(hits) if hit]
    return float(sum(per_positive) / len(per_positive))


def _random_case(rng: np.random.RandomState) -> tuple[np.ndarray, np.ndarray]:
    n = int(rng.randint(2, 60))
    positives = rng.rand(n) < rng.uniform(0.1, 0.9)
    positives[rng.randint(n)] = True
    scores = rng.permutation(n).astype(np.float64) + positives * rng.uniform(0, n)
    return scores + rng.rand(n) * 1e-3, positives


def test_reference_plain_ap_is_scikit_learns() -> None:
    """The reference's precision / recall are right: its non-interpolated AP is sklearn's."""
    from sklearn.metrics import average_precision_score

    rng = np.random.RandomState(0)
    for _ in range(100):
        scores, positives = _random_case(rng)
        assert reference_plain_ap(scores, positives) == pytest.approx(
            average_precision_score(positives, scores), abs=1e-12
        )


def test_11point_ap_matches_its_definition() -> None:
    rng = np.random.RandomState(1)
    for _ in range(300):
        scores, positives = _random_case(rng)
        assert voc07_11point_ap(scores, positives) == pytest.approx(
            reference_11point_ap(scores, positives), abs=1e-12
        )


def test_11point_ap_counts_a_recall_of_exactly_three_tenths() -> None:
    """10 positives: 3 first (recall 0.3 at precision 1), 7 negatives, the 7 others.
    Thresholds 0..0.3 reach precision 1, 0.4..1 reach 10/17 (np.linspace(0, 1, 11)[3] is
    0.30000000000000004, which a recall of 3/10 misses)."""
    positives = np.array([1] * 3 + [0] * 7 + [1] * 7 + [0] * 3, dtype=bool)
    scores = np.arange(len(positives), 0, -1, dtype=np.float64)
    expected = (4 * 1.0 + 7 * 10 / 17) / 11
    assert reference_11point_ap(scores, positives) == pytest.approx(expected)
    assert voc07_11point_ap(scores, positives) == pytest.approx(expected, abs=1e-12)


def test_interpolated_ap_matches_its_definition_and_bounds_sklearns() -> None:
    from sklearn.metrics import average_precision_score

    rng = np.random.RandomState(2)
    for _ in range(300):
        scores, positives = _random_case(rng)
        ap = interpolated_ap(scores, positives)
        assert ap == pytest.approx(reference_interpolated_ap(scores, positives), abs=1e-12)
        # interpolation only raises precisions, to the running maximum from below
        assert ap >= average_precision_score(positives, scores) - 1e-12


def test_ap_equals_sklearn_when_precision_never_rises() -> None:
    """Where the precision at the successive positives never increases, interpolation
    changes nothing and the AP is scikit-learn's (non-interpolated) one."""
    from sklearn.metrics import average_precision_score

    # P P N P N N P N: precisions at the positives 1, 1, 3/4, 4/7 (non-increasing)
    positives = np.array([1, 1, 0, 1, 0, 0, 1, 0], dtype=bool)
    scores = np.linspace(1.0, 0.0, len(positives))
    sk = average_precision_score(positives, scores)
    assert sk == pytest.approx((1 + 1 + 3 / 4 + 4 / 7) / 4)
    assert interpolated_ap(scores, positives) == pytest.approx(sk, abs=1e-12)
    # and it is below the interpolated AP once a later precision is higher (N P P)
    positives = np.array([0, 1, 1], dtype=bool)
    scores = np.array([3.0, 2.0, 1.0])
    assert average_precision_score(positives, scores) == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert interpolated_ap(scores, positives) == pytest.approx(2 / 3)
    assert voc07_11point_ap(scores, positives) == pytest.approx(2 / 3)


def test_ap_edge_cases_and_target_encodings() -> None:
    scores = np.array([0.9, 0.8, 0.3, 0.1])
    # perfect and reversed rankings
    for fn in (interpolated_ap, voc07_11point_ap):
        assert fn(scores, np.array([1, 1, 0, 0])) == pytest.approx(1.0)
        assert fn(scores, np.array([0, 0, 0, 0])) == 0.0  # no positive
    # N N P P: precisions 1/3 and 1/2 at the positives; interpolated, 1/2 at both
    assert interpolated_ap(scores, np.array([0, 0, 1, 1])) == pytest.approx(0.5)
    # VISSL binarises targets > 0: +1/-1 targets, 1/0 targets and booleans agree
    for fn in (interpolated_ap, voc07_11point_ap):
        a = fn(scores, np.array([1, -1, 1, -1]))
        assert a == fn(scores, np.array([1, 0, 1, 0])) == fn(scores, np.array([1, 0, 1, 0]) > 0)
        assert a < 1.0
    with pytest.raises(ValueError, match="4 scores but 3 targets"):
        interpolated_ap(scores, np.array([1, 0, 1]))


# ------------------------------------------------------------------ settings, targets
def test_linear_svc_has_vissls_parameters() -> None:
    params = make_svm(0.5, SvmSettings()).get_params()
    assert params["C"] == 0.5
    assert params["class_weight"] == {1: 2, -1: 1}
    assert params["intercept_scaling"] == 1.0
    assert params["penalty"] == "l2"
    assert params["loss"] == "squared_hinge"
    assert params["dual"] is True
    assert params["tol"] == 1e-4
    assert params["max_iter"] == 2000


def test_settings_from_the_default_config() -> None:
    from vissl.config.validation import default_tree

    settings = SvmSettings.from_config(default_tree()["SVM"])
    assert settings == SvmSettings(costs=(0.1, 0.01))
    assert (settings.loss, settings.penalty, settings.dual) == ("squared_hinge", "l2", True)


def test_cost_sweep_is_vissls() -> None:
    assert svm_costs([0.1, 0.01], -1.0, [4, 20]) == [0.1, 0.01]
    assert svm_costs([0.3], 2.0, [-1, 2]) == [0.3, 0.5, 1.0, 2.0]
    assert svm_costs([1.0, 1.0, 0.1], 10.0, [0, 1]) == [1.0, 0.1]  # repeats dropped
    with pytest.raises(ConfigError, match=r"config\.SVM\.costs\.power_range"):
        svm_costs([0.1], 2.0, [1])
    with pytest.raises(
        ConfigError, match=r"^config\.SVM\.costs\.power_range=\[300, 400\]: .*overflows"
    ):
        svm_costs([0.1], 10.0, [300, 400])


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"costs": ()}, "config.SVM.costs"),
        ({"costs": (0.1, 0.0)}, "config.SVM.costs"),
        ({"costs": (-1.0,)}, "config.SVM.costs"),
        ({"costs": ("0.1",)}, "config.SVM.costs"),
        ({"costs": (math.inf,)}, "config.SVM.costs"),
        ({"costs": (math.nan,)}, "config.SVM.costs"),
        ({"loss": "hinged"}, "config.SVM.loss"),
        ({"penalty": "l3"}, "config.SVM.penalty"),
        ({"penalty": "l1", "dual": True}, "config.SVM.dual"),
        ({"penalty": "l1", "loss": "hinge", "dual": False}, "config.SVM.penalty"),
        ({"loss": "hinge", "dual": False}, "config.SVM.dual"),
        ({"cross_val_folds": 1}, "config.SVM.cross_val_folds"),
        ({"max_iter": 0}, "config.SVM.max_iter"),
        ({"cls_list": (-1,)}, "config.SVM.cls_list"),
    ],
)
def test_bad_settings_name_their_key(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        SvmSettings(**kwargs)
    assert str(info.value).startswith(key)
    assert info.value.key_path is not None and info.value.key_path.startswith(key)


def test_targets_single_and_multi_label() -> None:
    y = np.array([2, 0, 2, 1])
    assert svm_classes(y) == [0, 1, 2]
    assert svm_classes(y, [2]) == [2]
    t, valid = binary_targets(y, 2)
    assert t.tolist() == [1, -1, 1, -1] and valid.all()
    # VOC07 as VISSL: 1 present, 0 absent, -1 ignored (a negative when training, left out
    # of the TEST AP)
    voc = np.array([[1, 0], [0, -1], [-1, 1], [1, 1]])
    assert svm_classes(voc) == [0, 1]
    t, valid = binary_targets(voc, 0)
    assert t.tolist() == [1, -1, -1, 1]
    assert valid.tolist() == [True, True, False, True]
    with pytest.raises(ConfigError, match=r"config\.SVM\.cls_list"):
        svm_classes(voc, [2])
    with pytest.raises(ValueError, match="shape"):
        svm_classes(np.zeros((2, 2, 2)))


def test_normalize_features_as_vissl() -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    out = normalize_features(x)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out[0], [3 / (5 + 1e-5), 4 / (5 + 1e-5)])
    assert (out[1] == 0).all()


# --------------------------------------------------------------------------- training
def _clusters(
    n_per_class: int, n_classes: int, dim: int, seed: int, noise: float = 0.05
) -> tuple[np.ndarray, np.ndarray]:
    """Classes around orthogonal directions (linearly separable after normalisation)."""
    rng = np.random.RandomState(seed)
    y = np.repeat(np.arange(n_classes), n_per_class)
    x = np.eye(dim)[y] * 3.0 + rng.randn(len(y), dim) * noise + 0.5
    perm = rng.permutation(len(y))
    return x[perm].astype(np.float32), y[perm]


def test_separable_features_give_full_map_and_top1() -> None:
    x_train, y_train = _clusters(20, 4, 8, seed=0)
    x_test, y_test = _clusters(15, 4, 8, seed=1)
    settings = SvmSettings(costs=(0.1, 1.0))
    model = train_svms(x_train, y_train, settings, verbose=False)
    assert model.classes == [0, 1, 2, 3]
    assert model.weights.shape == (4, 8) and model.cv_ap.shape == (4, 2)
    result = evaluate_svms(model, x_test, y_test)
    assert result.mean_ap == pytest.approx(100.0)
    assert result.mean_ap_11pt == pytest.approx(100.0)
    assert result.top1 == pytest.approx(100.0)
    assert result.total == 60
    assert set(result.per_class_ap) == {0, 1, 2, 3}


def test_random_labels_give_chance() -> None:
    rng = np.random.RandomState(0)
    x_train, x_test = rng.randn(300, 32), rng.randn(2000, 32)
    y_train, y_test = rng.randint(0, 4, 300), rng.randint(0, 4, 2000)
    model = train_svms(x_train, y_train, SvmSettings(costs=(0.1, 1.0)), verbose=False)
    result = evaluate_svms(model, x_test, y_test)
    # chance: an AP of the class frequency (1/4), a top-1 of 1/4
    assert 20.0 < result.mean_ap < 32.0
    assert 20.0 < result.mean_ap_11pt < 35.0
    assert result.top1 is not None and 20.0 < result.top1 < 30.0
    # the cross-validated APs on TRAIN are at chance too
    assert np.nanmean(model.cv_ap) < 0.35


def test_cross_validated_ap_is_vissls_cross_val_score() -> None:
    """VISSL: cross_val_score(LinearSVC, X, ±1, cv=folds, scoring="average_precision")."""
    from sklearn.model_selection import cross_val_score
    from sklearn.svm import LinearSVC

    rng = np.random.RandomState(3)
    x = normalize_features(rng.randn(90, 10))
    y = np.where(x[:, 0] + 0.5 * rng.randn(90) > 0.2, 1, -1)
    settings = SvmSettings(costs=(0.01, 1.0))
    for cost in settings.costs:
        vissl = cross_val_score(
            LinearSVC(
                C=cost,
                class_weight={1: 2, -1: 1},
                intercept_scaling=1.0,
                penalty="l2",
                loss="squared_hinge",
                tol=0.0001,
                dual=True,
                max_iter=2000,
            ),
            x,
            y,
            cv=3,
            scoring="average_precision",
        ).mean()
        assert cross_validated_ap(x, y, cost, settings) == pytest.approx(vissl, abs=1e-9)
    # too few positives to cross-validate: NaN
    y_one = -np.ones(90, dtype=int)
    y_one[5] = 1
    assert math.isnan(cross_validated_ap(x, y_one, 1.0, settings))


def test_each_class_gets_its_best_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost of best cross-validated AP per class (the first among equals; the first
    cost when nothing could be cross-validated), and its SVM trained on all of TRAIN."""
    from sklearn.svm import LinearSVC

    x, y = _clusters(10, 4, 6, seed=4, noise=0.5)
    costs = (0.01, 0.1, 1.0)
    cv = {  # class -> AP per cost
        0: [0.5, 0.9, 0.7],
        1: [0.8, 0.6, 0.8],  # a tie: the first
        2: [0.1, 0.2, 0.3],
        3: [math.nan, math.nan, math.nan],
    }
    seen: dict[int, list[float]] = {}

    def fake_cv(xx: np.ndarray, t: np.ndarray, cost: float, settings: SvmSettings) -> float:
        cls = int(y[np.flatnonzero(t == 1)[0]])
        seen.setdefault(cls, []).append(cost)
        return cv[cls][costs.index(cost)]

    monkeypatch.setattr(svm_utils, "cross_validated_ap", fake_cv)
    settings = SvmSettings(costs=costs)
    model = train_svms(x, y, settings, verbose=False)
    assert seen == {c: list(costs) for c in range(4)}  # every cost tried for every class
    assert model.chosen_costs == [0.1, 0.01, 1.0, 0.01]
    np.testing.assert_array_equal(model.cv_ap, np.array([cv[c] for c in range(4)]))
    xn = normalize_features(x)
    for i, cls in enumerate(model.classes):
        ref = LinearSVC(
            C=model.chosen_costs[i],
            class_weight={1: 2, -1: 1},
            dual=True,  # scikit-learn's default "auto" solves the primal here
            tol=1e-4,
            max_iter=2000,
            random_state=0,
        ).fit(xn, np.where(y == cls, 1, -1))
        np.testing.assert_allclose(model.weights[i], ref.coef_[0], rtol=1e-6, atol=1e-9)
        assert model.bias[i] == pytest.approx(ref.intercept_[0], rel=1e-6, abs=1e-9)


def test_cost_sweep_on_real_cross_validation_picks_the_argmax() -> None:
    x, y = _clusters(15, 3, 6, seed=5, noise=1.5)
    model = train_svms(x, y, SvmSettings(costs=(1e-4, 0.01, 1.0, 100.0)), verbose=False)
    for row, cost in zip(model.cv_ap, model.chosen_costs, strict=True):
        assert cost == model.costs[int(np.argmax(row))]
    # the shared cost (low-shot): the best mean over the classes
    shared = train_svms(x, y, SvmSettings(costs=model.costs), shared_cost=True, verbose=False)
    best = model.costs[int(np.argmax(model.cv_ap.mean(axis=0)))]
    assert shared.chosen_costs == [best] * 3
    np.testing.assert_allclose(shared.cv_ap, model.cv_ap)


def test_multi_label_voc_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ignored (-1) TEST samples are left out of a class's AP; top-1 is not defined."""
    rng = np.random.RandomState(6)
    x_train, y_train = _clusters(12, 3, 6, seed=6)
    voc_train = np.where(np.eye(3, dtype=int)[y_train] == 1, 1, 0)
    voc_train[rng.rand(*voc_train.shape) < 0.1] = -1
    voc_train[np.arange(3), np.arange(3)] = 1  # still positives everywhere
    model = train_svms(x_train, voc_train, SvmSettings(costs=(1.0,)), verbose=False)
    x_test, y_test = _clusters(10, 3, 6, seed=7)
    voc_test = np.eye(3, dtype=int)[y_test]
    result = evaluate_svms(model, x_test, voc_test)
    assert result.top1 is None
    assert result.mean_ap == pytest.approx(100.0)
    # a class-0 look-alike marked -1 for class 0 does not count against class 0 ...
    extra = x_test[y_test == 0][:1]
    x_more = np.concatenate([x_test, extra])
    ignored = np.concatenate([voc_test, [[-1, 0, 0]]])
    assert evaluate_svms(model, x_more, ignored).per_class_ap[0] == pytest.approx(100.0)
    # ... where marked absent (0) it is a negative ranked first
    absent = np.concatenate([voc_test, [[0, 0, 0]]])
    assert evaluate_svms(model, x_more, absent).per_class_ap[0] < 100.0


def test_cls_list_restricts_the_classes() -> None:
    x, y = _clusters(10, 4, 6, seed=8)
    model = train_svms(x, y, SvmSettings(costs=(1.0,), cls_list=(1, 3)), verbose=False)
    assert model.classes == [1, 3]
    result = evaluate_svms(model, x, y)
    assert set(result.per_class_ap) == {1, 3}
    assert result.top1 == pytest.approx(100.0)  # among the samples of classes 1 and 3
    with pytest.raises(ValueError, match="class 7 has no positive TRAIN sample"):
        train_svms(x, y, SvmSettings(costs=(1.0,), cls_list=(7,)), verbose=False)
    voc = np.ones((len(y), 2), dtype=int)
    voc[0, 1] = 0
    with pytest.raises(ValueError, match="class 0 has no negative TRAIN sample"):
        train_svms(x, voc, SvmSettings(costs=(1.0,)), verbose=False)


def test_saved_svms_are_reused_unless_force_retrain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, y = _clusters(8, 3, 5, seed=9)
    settings = SvmSettings(costs=(0.1, 1.0))
    first = train_svms(x, y, settings, cache_dir=str(tmp_path), verbose=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cls0.npz", "cls1.npz", "cls2.npz"]

    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("trained again")

    monkeypatch.setattr(svm_utils, "make_svm", no_training)
    again = train_svms(x, y, settings, cache_dir=str(tmp_path), verbose=False)
    np.testing.assert_array_equal(again.weights, first.weights)
    np.testing.assert_array_equal(again.bias, first.bias)
    assert again.chosen_costs == first.chosen_costs
    # other features, other settings or force_retrain: trained again
    for xx, ss in (
        (x + 1.0, settings),
        (x, SvmSettings(costs=(0.1,))),
        (x, SvmSettings(costs=(0.1, 1.0), force_retrain=True)),
    ):
        with pytest.raises(AssertionError, match="trained again"):
            train_svms(xx, y, ss, cache_dir=str(tmp_path), verbose=False)
    with pytest.raises(ValueError, match="shared cost"):
        train_svms(x, y, settings, cache_dir=str(tmp_path), shared_cost=True)


def test_mismatched_lengths() -> None:
    x, y = _clusters(5, 2, 4, seed=10)
    with pytest.raises(ValueError, match="TRAIN features"):
        train_svms(x, y[:-1], SvmSettings(), verbose=False)
    model = train_svms(x, y, SvmSettings(costs=(1.0,)), verbose=False)
    with pytest.raises(ValueError, match="TEST features"):
        evaluate_svms(model, x, y[:-1])
    with pytest.raises(ValueError, match="no class of the SVMs has a positive TEST sample"):
        evaluate_svms(model, x, np.full(len(x), 5))

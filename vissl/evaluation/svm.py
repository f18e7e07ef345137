"""Linear SVM benchmark on extracted features (VISSL's ``SVM`` keys, ``tools/train_svm.py``).

As VISSL's ``SVMTrainer``: one scikit-learn ``LinearSVC`` per class (one vs rest, class
weights ``{positive: 2, negative: 1}``), on L2-normalised features (``normalize``). For
each class, every cost of the sweep is scored by the mean average precision of a
``cross_val_folds``-fold stratified cross-validation on TRAIN (scikit-learn's average
precision, as VISSL's ``cross_val_score(scoring="average_precision")``); the cost of best
score (the first listed among equals) is kept, and its SVM is trained on all of TRAIN.

On TEST (:func:`evaluate_svms`, percentages):

- ``mean_ap``: the mean over the classes of the area under the interpolated
  precision-recall curve, VISSL's ``svm_utils/evaluate.py`` (the figure VISSL reports
  for its VOC07 SVM benchmark);
- ``mean_ap_11pt``: the PASCAL VOC 2007 devkit's 11-point interpolated AP;
- ``top1``: accuracy of the class whose SVM scores highest (single-label targets).

Targets are ``(N,)`` class indices, or VISSL's multi-label ``(N, C)`` arrays (VOC07):
1 present, 0 absent, -1 ignored. As VISSL, only 1 is a positive when training (0 and -1
are negatives), and TEST samples marked -1 for a class are left out of that class's AP.

    settings = SvmSettings.from_config(cfg.SVM)
    model = train_svms(train_feats, train_labels, settings)
    result = evaluate_svms(model, test_feats, test_labels)

With ``cache_dir``, each class's SVM is saved there (``cls<c>.npz``, no pickle) with a
fingerprint of the TRAIN features, labels and settings; a later run with the same inputs
reuses it unless ``force_retrain`` (VISSL's key), so an interrupted sweep resumes.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vissl.errors import ConfigError

logger = logging.getLogger(__name__)

_KEY = "config.SVM"
# VISSL's LinearSVC class weights: a positive counts twice a negative.
CLASS_WEIGHT = {1: 2.0, -1: 1.0}
_LOSSES = ("squared_hinge", "hinge")
_PENALTIES = ("l2", "l1")


@dataclass(frozen=True)
class SvmSettings:
    """What VISSL's ``SVM`` section configures (see :meth:`from_config`).

    Raises:
        ConfigError: an impossible setting (the message names its ``config.SVM`` key).
    """

    costs: tuple[float, ...] = (0.1, 0.01)
    normalize: bool = True
    cls_list: tuple[int, ...] = ()
    loss: str = "squared_hinge"
    penalty: str = "l2"
    dual: bool = True
    max_iter: int = 2000
    cross_val_folds: int = 3
    force_retrain: bool = False

    def __post_init__(self) -> None:
        if not self.costs or not all(
            _is_number(c) and c > 0 and math.isfinite(c) for c in self.costs
        ):
            raise ConfigError(
                f"{_KEY}.costs: the costs to try must be finite positive numbers, at least one "
                f"(costs_list, plus base ** p when base > 0); got {list(self.costs)}.",
                f"{_KEY}.costs.costs_list",
            )
        if self.loss not in _LOSSES:
            raise ConfigError(
                f"{_KEY}.loss={self.loss!r} is not one of {list(_LOSSES)}.", f"{_KEY}.loss"
            )
        if self.penalty not in _PENALTIES:
            raise ConfigError(
                f"{_KEY}.penalty={self.penalty!r} is not one of {list(_PENALTIES)}.",
                f"{_KEY}.penalty",
            )
        if self.penalty == "l1" and self.loss == "hinge":
            raise ConfigError(
                f"{_KEY}.penalty='l1' does not go with {_KEY}.loss='hinge' in LinearSVC; "
                "use loss 'squared_hinge' with dual False.",
                f"{_KEY}.penalty",
            )
        if self.penalty == "l1" and self.dual:
            raise ConfigError(
                f"{_KEY}.dual=True does not go with {_KEY}.penalty='l1' in LinearSVC; "
                "set dual to False.",
                f"{_KEY}.dual",
            )
        if self.loss == "hinge" and not self.dual:
            raise ConfigError(
                f"{_KEY}.dual=False does not go with {_KEY}.loss='hinge' in LinearSVC; "
                "set dual to True or loss to 'squared_hinge'.",
                f"{_KEY}.dual",
            )
        if self.cross_val_folds < 2:
            raise ConfigError(
                f"{_KEY}.cross_val_folds={self.cross_val_folds} must be >= 2.",
                f"{_KEY}.cross_val_folds",
            )
        if self.max_iter < 1:
            raise ConfigError(f"{_KEY}.max_iter={self.max_iter} must be >= 1.", f"{_KEY}.max_iter")
        if not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in self.cls_list
        ):
            raise ConfigError(
                f"{_KEY}.cls_list must hold class indices (integers >= 0); "
                f"got {list(self.cls_list)}.",
                f"{_KEY}.cls_list",
            )

    @classmethod
    def from_config(cls, svm_cfg: Mapping[str, Any]) -> SvmSettings:
        """Settings from the ``SVM`` config section.

        Raises:
            ConfigError: an impossible setting (the message names its key).
        """
        costs = svm_cfg["costs"]
        return cls(
            costs=tuple(svm_costs(costs["costs_list"], costs["base"], costs["power_range"])),
            normalize=bool(svm_cfg["normalize"]),
            cls_list=tuple(svm_cfg["cls_list"]),
            loss=str(svm_cfg["loss"]),
            penalty=str(svm_cfg["penalty"]),
            dual=bool(svm_cfg["dual"]),
            max_iter=int(svm_cfg["max_iter"]),
            cross_val_folds=int(svm_cfg["cross_val_folds"]),
            force_retrain=bool(svm_cfg["force_retrain"]),
        )

    def fingerprint_fields(self) -> str:
        """The settings that change a trained SVM (``force_retrain`` and ``cls_list`` do not)."""
        fields = (self.costs, self.normalize, self.loss, self.penalty, self.dual)
        return repr((*fields, self.max_iter, self.cross_val_folds))


@dataclass
class SvmModel:
    """Trained one-vs-rest SVMs: class ``classes[i]`` scores ``x @ weights[i] + bias[i]``.

    ``cv_ap[i, j]``: the cross-validated AP of class ``classes[i]`` at cost ``costs[j]``
    (NaN where the class had too few samples to cross-validate).
    """

    classes: list[int]
    weights: np.ndarray
    bias: np.ndarray
    costs: tuple[float, ...]
    chosen_costs: list[float]
    cv_ap: np.ndarray
    normalize: bool = True


@dataclass(frozen=True)
class SvmResult:
    """TEST metrics of :func:`evaluate_svms` (percentages; ``top1`` None for multi-label)."""

    mean_ap: float
    mean_ap_11pt: float
    top1: float | None
    total: int
    per_class_ap: dict[int, float] = field(default_factory=dict)
    per_class_ap_11pt: dict[int, float] = field(default_factory=dict)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def svm_costs(costs_list: Sequence[float], base: float, power_range: Sequence[int]) -> list[float]:
    """VISSL's cost sweep: ``costs_list``, then ``base ** p`` for p in ``range(*power_range)``
    when ``base > 0`` (order kept, repeats dropped).

    Raises:
        ConfigError: ``power_range`` is not two integers.
    """
    costs = list(costs_list)
    if float(base) > 0:
        if len(power_range) != 2 or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in power_range
        ):
            raise ConfigError(
                f"{_KEY}.costs.power_range must be two integers [start, stop); "
                f"got {list(power_range)}.",
                f"{_KEY}.costs.power_range",
            )
        try:
            costs += [float(base) ** p for p in range(power_range[0], power_range[1])]
        except OverflowError:
            raise ConfigError(
                f"{_KEY}.costs.power_range={list(power_range)}: base ** p overflows for "
                f"base={base}; use a smaller power_range.",
                f"{_KEY}.costs.power_range",
            ) from None
    out: list[float] = []
    for c in costs:
        if c not in out:
            out.append(c)
    return out


def normalize_features(features: np.ndarray) -> np.ndarray:
    """VISSL's row normalisation ``x / (||x|| + 1e-5)``, as float64 ``(N, D)``."""
    feats = np.asarray(features, dtype=np.float64).reshape(len(features), -1)
    return feats / (np.linalg.norm(feats, axis=1, keepdims=True) + 1e-5)


# ------------------------------------------------------------------------------ metrics
def _precision_recall(scores: np.ndarray, positives: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # VISSL's get_precision_recall: a target > 0 is a positive (1 / True; 0, -1, False not),
    # samples ranked by decreasing score
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    p = np.asarray(positives).reshape(-1)
    if len(s) != len(p):
        raise ValueError(f"{len(s)} scores but {len(p)} targets")
    order = np.argsort(-s, kind="stable")
    hits = (p > 0)[order]
    tp = np.cumsum(hits)
    fp = np.cumsum(~hits)
    return tp / (tp + fp), tp / max(int(hits.sum()), 1)


def interpolated_ap(scores: np.ndarray, positives: np.ndarray) -> float:
    """Area under the interpolated precision-recall curve, in [0, 1] (VISSL's
    ``calculate_ap``; the PASCAL VOC 2010+ measure). ``positives``: targets, > 0 for a
    positive (1 / True; 0, -1, False are negatives). 0 when there is no positive."""
    if not (np.asarray(positives) > 0).any():
        return 0.0
    precision, recall = _precision_recall(scores, positives)
    mrec = np.concatenate([[0.0], recall, [1.0]])
    mpre = np.concatenate([[0.0], precision, [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    steps = np.flatnonzero(mrec[1:] != mrec[:-1]) + 1
    return float(np.sum((mrec[steps] - mrec[steps - 1]) * mpre[steps]))


def voc07_11point_ap(scores: np.ndarray, positives: np.ndarray) -> float:
    """PASCAL VOC 2007 11-point interpolated average precision, in [0, 1].

    The mean over recall thresholds 0, 0.1, ..., 1 of the highest precision reached at a
    recall at least that high (0 where none is). ``positives`` as :func:`interpolated_ap`.
    0 when there is no positive.
    """
    if not (np.asarray(positives) > 0).any():
        return 0.0
    precision, recall = _precision_recall(scores, positives)
    total = 0.0
    # thresholds i / 10 exactly: np.arange(0, 1.1, 0.1) or np.linspace(0, 1, 11) give
    # 0.30000000000000004, 0.6000000000000001 and 0.7000000000000001, which a recall of
    # exactly 3/10, 6/10 or 7/10 would not reach
    for t in np.arange(11) / 10.0:
        reached = precision[recall >= t]
        total += float(reached.max()) if reached.size else 0.0
    return total / 11.0


# ----------------------------------------------------------------------------- targets
def svm_classes(labels: np.ndarray, cls_list: Sequence[int] = ()) -> list[int]:
    """The classes to train an SVM for: ``cls_list``, else every class of ``labels``.

    Raises:
        ValueError: targets that are neither ``(N,)`` nor ``(N, C)``, or a ``cls_list``
            entry out of the ``C`` columns of multi-label targets.
    """
    y = np.asarray(labels)
    if y.ndim == 2:
        if cls_list and max(cls_list) >= y.shape[1]:
            raise ConfigError(
                f"{_KEY}.cls_list={list(cls_list)} names a class beyond the {y.shape[1]} "
                "columns of the multi-label targets.",
                f"{_KEY}.cls_list",
            )
        return [int(c) for c in cls_list] or list(range(y.shape[1]))
    if y.ndim != 1:
        raise ValueError(f"SVM targets must be (N,) or (N, C); got shape {y.shape}")
    return [int(c) for c in cls_list] or sorted(int(c) for c in np.unique(y))


def binary_targets(labels: np.ndarray, cls: int) -> tuple[np.ndarray, np.ndarray]:
    """``(targets, valid)`` of class ``cls``: +1/-1 SVM targets (training: only 1 is
    positive) and the samples that count in its TEST AP (multi-label: not -1)."""
    y = np.asarray(labels)
    if y.ndim == 2:
        column = y[:, cls]
        return np.where(column == 1, 1, -1), column != -1
    return np.where(y.reshape(-1) == cls, 1, -1), np.ones(len(y), dtype=bool)


# ---------------------------------------------------------------------------- training
def make_svm(cost: float, settings: SvmSettings) -> Any:
    """The ``LinearSVC`` of one class at ``cost`` (VISSL's parameters, seeded)."""
    from sklearn.svm import LinearSVC

    return LinearSVC(
        C=float(cost),
        class_weight=CLASS_WEIGHT,
        intercept_scaling=1.0,
        penalty=settings.penalty,
        loss=settings.loss,
        tol=1e-4,
        dual=settings.dual,
        max_iter=settings.max_iter,
        random_state=0,
    )


def cross_validated_ap(x: np.ndarray, y: np.ndarray, cost: float, settings: SvmSettings) -> float:
    """Mean scikit-learn average precision of a stratified k-fold cross-validation
    (unshuffled, as VISSL's ``cross_val_score``); NaN if a class has < 2 samples.

    The number of folds is ``cross_val_folds``, fewer when a class has fewer samples.
    """
    from sklearn.metrics import average_precision_score
    from sklearn.model_selection import StratifiedKFold

    n_pos = int((y == 1).sum())
    n_splits = min(settings.cross_val_folds, n_pos, len(y) - n_pos)
    if n_splits < 2:
        return float("nan")
    aps = []
    for train_idx, val_idx in StratifiedKFold(n_splits=n_splits).split(x, y):
        svm = make_svm(cost, settings).fit(x[train_idx], y[train_idx])
        aps.append(average_precision_score(y[val_idx] == 1, svm.decision_function(x[val_idx])))
    return float(np.mean(aps))


def _fingerprint(features: np.ndarray, labels: np.ndarray, settings: SvmSettings) -> str:
    h = hashlib.sha256()
    for arr in (features, labels):
        a = np.ascontiguousarray(arr)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.reshape(-1).view(np.uint8).data)
    h.update(settings.fingerprint_fields().encode())
    return h.hexdigest()


def _load_cached(path: str, fingerprint: str) -> dict[str, Any] | None:
    if not os.path.isfile(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            if str(saved["fingerprint"]) != fingerprint:
                return None
            return {k: saved[k] for k in ("weights", "bias", "cost", "cv_ap")}
    except (OSError, KeyError, ValueError):
        return None


def _save_cached(path: str, fingerprint: str, **arrays: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, fingerprint=np.str_(fingerprint), **arrays)
    os.replace(tmp, path)


def _cv_row(x: np.ndarray, targets: np.ndarray, settings: SvmSettings) -> np.ndarray:
    return np.array([cross_validated_ap(x, targets, c, settings) for c in settings.costs])


def _best_cost_index(cv_ap: np.ndarray) -> int:
    # best AP, the first cost listed among equals (VISSL's argmax); no CV: the first cost
    return 0 if np.isnan(cv_ap).all() else int(np.nanargmax(cv_ap))


def _fit(
    x: np.ndarray, targets: np.ndarray, cost: float, settings: SvmSettings
) -> tuple[np.ndarray, float]:
    svm = make_svm(cost, settings).fit(x, targets)
    return svm.coef_.reshape(-1), float(svm.intercept_.reshape(-1)[0])


def train_svms(
    features: np.ndarray,
    labels: np.ndarray,
    settings: SvmSettings,
    *,
    shared_cost: bool = False,
    cache_dir: str | None = None,
    progress: bool = False,
    desc: str = "SVM",
    verbose: bool = True,
) -> SvmModel:
    """One SVM per class, each at the cost of best cross-validated AP on TRAIN.

    Args:
        features: ``(N, ...)`` TRAIN features (flattened).
        labels: ``(N,)`` class indices or ``(N, C)`` multi-label targets (see module doc).
        shared_cost: one cost for every class, the one of best mean cross-validated AP
            over the classes, so that the scores of the classes compare (top-1).
        cache_dir: folder to save each class's SVM in and reuse it from (not with
            ``shared_cost``).
        progress: show a progress bar over the classes.
        verbose: log each class's cross-validated APs and cost (else at debug level).

    Raises:
        ValueError: mismatched lengths, a class without a positive or without a negative
            TRAIN sample, or ``shared_cost`` with ``cache_dir``.
    """
    from sklearn.exceptions import ConvergenceWarning

    raw = np.asarray(features)
    y = np.asarray(labels)
    if len(raw) != len(y):
        raise ValueError(f"{len(raw)} TRAIN features but {len(y)} labels")
    if shared_cost and cache_dir:
        raise ValueError("SVMs of a shared cost are not cached: give no cache_dir")
    x = (
        normalize_features(raw)
        if settings.normalize
        else raw.reshape(len(raw), -1).astype(np.float64)
    )
    classes = svm_classes(y, settings.cls_list)
    targets_of = {}
    for cls in classes:
        targets_of[cls] = binary_targets(y, cls)[0]
        if not (targets_of[cls] == 1).any():
            raise ValueError(f"class {cls} has no positive TRAIN sample")
        if (targets_of[cls] == 1).all():
            raise ValueError(f"class {cls} has no negative TRAIN sample")
    fingerprint = _fingerprint(raw, y, settings) if cache_dir else ""
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
    log = logger.info if verbose else logger.debug
    log(
        "%s: %d classes, %d TRAIN samples of dim %d, costs %s",
        desc,
        len(classes),
        len(x),
        x.shape[1],
        list(settings.costs),
    )
    iterator: Any = classes
    if progress:
        from tqdm import tqdm

        iterator = tqdm(classes, desc=desc, unit="class")
    weights, bias, chosen, cv_aps = [], [], [], []
    reused = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if shared_cost:
            cv_matrix = np.stack([_cv_row(x, targets_of[cls], settings) for cls in iterator])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a cost without any CV
                mean_ap = np.nanmean(cv_matrix, axis=0)
            cost = settings.costs[_best_cost_index(mean_ap)]
            log(
                "%s: mean cross-validated AP %s -> cost %g", desc, _by_cost(settings, mean_ap), cost
            )
            for cls, cv_ap in zip(classes, cv_matrix, strict=True):
                w, b = _fit(x, targets_of[cls], cost, settings)
                weights.append(w)
                bias.append(b)
                chosen.append(cost)
                cv_aps.append(cv_ap)
        else:
            for cls in iterator:
                path = os.path.join(cache_dir, f"cls{cls}.npz") if cache_dir else ""
                cached = (
                    _load_cached(path, fingerprint) if path and not settings.force_retrain else None
                )
                if cached is not None:
                    w, b = cached["weights"], float(cached["bias"])
                    cost, cv_ap = float(cached["cost"]), cached["cv_ap"]
                    reused += 1
                else:
                    cv_ap = _cv_row(x, targets_of[cls], settings)
                    cost = settings.costs[_best_cost_index(cv_ap)]
                    w, b = _fit(x, targets_of[cls], cost, settings)
                    if path:
                        _save_cached(path, fingerprint, weights=w, bias=b, cost=cost, cv_ap=cv_ap)
                log(
                    "%s class %d: cross-validated AP %s -> cost %g",
                    desc,
                    cls,
                    _by_cost(settings, cv_ap),
                    cost,
                )
                weights.append(w)
                bias.append(b)
                chosen.append(cost)
                cv_aps.append(cv_ap)
    if reused:
        logger.info(
            "%s: reused %d SVMs saved in %s (SVM.force_retrain=True trains them again)",
            desc,
            reused,
            cache_dir,
        )
    return SvmModel(
        classes=classes,
        weights=np.stack(weights),
        bias=np.asarray(bias, dtype=np.float64),
        costs=tuple(settings.costs),
        chosen_costs=chosen,
        cv_ap=np.stack(cv_aps),
        normalize=settings.normalize,
    )


def _by_cost(settings: SvmSettings, aps: np.ndarray) -> dict[float, float]:
    return {c: round(float(a), 4) for c, a in zip(settings.costs, aps, strict=True)}


# -------------------------------------------------------------------------- evaluation
def svm_scores(model: SvmModel, features: np.ndarray) -> np.ndarray:
    """``(N, len(model.classes))`` SVM decision values."""
    raw = np.asarray(features)
    x = normalize_features(raw) if model.normalize else raw.reshape(len(raw), -1).astype(np.float64)
    return x @ model.weights.T + model.bias


def evaluate_svms(model: SvmModel, features: np.ndarray, labels: np.ndarray) -> SvmResult:
    """Mean AP (VISSL's and VOC07 11-point) over the model's classes, and top-1.

    A class without a positive TEST sample is left out of the means (with a warning).
    Top-1 counts the TEST samples whose label is one of the model's classes.

    Raises:
        ValueError: no class has a positive TEST sample.
    """
    y = np.asarray(labels)
    if len(y) != len(features):
        raise ValueError(f"{len(features)} TEST features but {len(y)} labels")
    scores = svm_scores(model, features)
    per_class: dict[int, float] = {}
    per_class_11: dict[int, float] = {}
    for i, cls in enumerate(model.classes):
        targets, valid = binary_targets(y, cls)
        positives = targets[valid] == 1
        if not positives.any():
            logger.warning("class %d has no positive TEST sample: left out of the mAP", cls)
            continue
        per_class[cls] = 100.0 * interpolated_ap(scores[valid, i], positives)
        per_class_11[cls] = 100.0 * voc07_11point_ap(scores[valid, i], positives)
    if not per_class:
        raise ValueError("no class of the SVMs has a positive TEST sample")
    top1: float | None = None
    if y.ndim == 1:
        known = np.isin(y, model.classes)
        predicted = np.asarray(model.classes)[scores.argmax(axis=1)]
        top1 = 100.0 * float((predicted[known] == y[known]).mean()) if known.any() else 0.0
    return SvmResult(
        mean_ap=float(np.mean(list(per_class.values()))),
        mean_ap_11pt=float(np.mean(list(per_class_11.values()))),
        top1=top1,
        total=len(y),
        per_class_ap=per_class,
        per_class_ap_11pt=per_class_11,
    )

"""The command of ``tools/low_shot_test.py``: low-shot benchmark of a model's features (VISSL's
``LOW_SHOT_BENCHMARK``)."""

from __future__ import annotations

import logging
import os
from typing import Any

from vissl.errors import ConfigError
from vissl.evaluation.cli import report_layer, setup_tool_logging
from vissl.evaluation.features import (
    extract_or_locate_features,
    feature_layers,
    load_split_features,
)
from vissl.evaluation.low_shot import METHODS, LowShotResult, max_samples_per_class, run_low_shot
from vissl.evaluation.svm import SvmSettings
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.logger import shutdown_logging

logger = logging.getLogger("vissl.tools")

_LS = "config.LOW_SHOT_BENCHMARK"
RESULTS_FILE = "low_shot_results.json"


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_pos_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x > 0


def check_low_shot_settings(ls: Any) -> tuple[str, list[int], list[int], list[float]]:
    """``(method, samples_per_class, seeds, lambdas)`` of ``LOW_SHOT_BENCHMARK``.

    Raises:
        ConfigError: a bad value; the message names its key.
    """
    method = str(ls.METHOD)
    if method not in METHODS:
        raise ConfigError(
            f"{_LS}.METHOD={method!r} is not one of {list(METHODS)}.", f"{_LS}.METHOD"
        )
    ks = list(ls.SAMPLES_PER_CLASS)
    if not ks or not all(_is_int(k) and k >= 1 for k in ks):
        raise ConfigError(
            f"{_LS}.SAMPLES_PER_CLASS must be a non-empty list of integers >= 1; got {ks!r}.",
            f"{_LS}.SAMPLES_PER_CLASS",
        )
    seeds = list(ls.LOGISTIC_REGRESSION.SEEDS)
    if not seeds or not all(_is_int(s) and 0 <= s < 2**32 for s in seeds):
        raise ConfigError(
            f"{_LS}.LOGISTIC_REGRESSION.SEEDS must be a non-empty list of integers in "
            f"[0, 2**32) (numpy seeds); got {seeds!r}.",
            f"{_LS}.LOGISTIC_REGRESSION.SEEDS",
        )
    lam = ls.LOGISTIC_REGRESSION.LAMBDA
    lambdas = list(lam) if isinstance(lam, list | tuple) else [lam]
    if not lambdas or not all(_is_pos_number(x) for x in lambdas):
        raise ConfigError(
            f"{_LS}.LOGISTIC_REGRESSION.LAMBDA must be a positive number or a non-empty list "
            f"of them; got {lam!r}.",
            f"{_LS}.LOGISTIC_REGRESSION.LAMBDA",
        )
    return method, list(dict.fromkeys(ks)), seeds, [float(x) for x in lambdas]


def summary_line(
    results: list[LowShotResult], method: str, layer: str, n_train: int, n_test: int
) -> str:
    """The printed result of one layer: mean ± std top-1 for each ``k``."""
    per_k = " ".join(f"k={r.k} {r.mean:.2f}±{r.std:.2f}%" for r in results)
    return (
        f"low_shot: top-1 {per_k} method={method} seeds={len(results[0].seeds)} "
        f"layer={layer} train={n_train} test={n_test}"
    )


def _low_shot_at_layer(
    folder: str,
    layer: str,
    method: str,
    ks: list[int],
    seeds: list[int],
    lambdas: list[float],
    settings: SvmSettings,
) -> tuple[dict[str, Any], str]:
    data = load_split_features(folder, layer, f"{_LS}.FEATURES.PATH")
    train, test = data["train"], data["test"]
    if train["targets"].ndim != 1 or test["targets"].ndim != 1:
        raise ConfigError(
            "the low-shot benchmark needs single-label targets (one class per sample); the "
            f"features in {folder} have targets of shape {train['targets'].shape}.",
            f"{_LS}.FEATURES.PATH",
        )
    smallest = max_samples_per_class(train["targets"])
    if max(ks) > smallest:
        raise ConfigError(
            f"{_LS}.SAMPLES_PER_CLASS={ks}: the smallest TRAIN class has {smallest} samples "
            f"(features in {folder}); ask for at most {smallest} per class.",
            f"{_LS}.SAMPLES_PER_CLASS",
        )
    n_train, n_test = len(train["features"]), len(test["features"])
    logger.info(
        "low-shot on %s features: %d TRAIN, %d TEST, dim %d, %s, k=%s, seeds=%s",
        layer,
        n_train,
        n_test,
        train["features"].reshape(n_train, -1).shape[1],
        method,
        ks,
        seeds,
    )
    try:
        results = run_low_shot(
            train["features"],
            train["targets"],
            test["features"],
            test["targets"],
            samples_per_class=ks,
            seeds=seeds,
            method=method,
            lambdas=lambdas,
            svm_settings=settings,
            progress=True,
            desc=f"low-shot {layer}",
        )
    except ConfigError:
        raise
    except ValueError as err:  # data that do not fit (e.g. a single TRAIN class)
        key = "config.SVM.cls_list" if method == "svm" else f"{_LS}.FEATURES.PATH"
        raise ConfigError(
            f"low-shot {method} on the {layer} features in {folder}: {err}", key
        ) from err
    for r in results:
        logger.info(
            "low-shot %s k=%d: top-1 %.2f ± %.2f%% over seeds %s (%s)",
            layer,
            r.k,
            r.mean,
            r.std,
            list(r.seeds),
            ", ".join(f"{a:.2f}" for a in r.accuracies),
        )
    summary = {
        "train": n_train,
        "test": n_test,
        "results": [
            {
                "k": r.k,
                "mean": r.mean,
                "std": r.std,
                "seeds": list(r.seeds),
                "accuracies": list(r.accuracies),
                "chosen": list(r.chosen),
                **({"mean_ap": list(r.mean_aps)} if r.mean_aps else {}),
            }
            for r in results
        ],
    }
    return summary, summary_line(results, method, layer, n_train, n_test)


def main(argv: list[str]) -> int:
    """Extract (or read) features, run the low-shot draws, print the summary last."""
    root, cfg = hydra_compose_and_validate(argv)
    ls = cfg.LOW_SHOT_BENCHMARK
    method, ks, seeds, lambdas = check_low_shot_settings(ls)
    settings = SvmSettings.from_config(cfg.SVM)
    layers = feature_layers(cfg, str(ls.FEATURE_TYPE), f"{_LS}.FEATURE_TYPE")
    folder = extract_or_locate_features(
        cfg, int(root.node_id), str(ls.FEATURES.PATH), f"{_LS}.FEATURES.PATH"
    )
    if folder is None:
        print(f"low_shot: node {root.node_id}: features extracted; node 0 evaluates.")
        return 0
    out_dir = setup_tool_logging(cfg)
    results_path = os.path.join(out_dir, RESULTS_FILE)
    report: dict[str, Any] = {
        "benchmark": "low_shot",
        "weights": str(cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE),
        "features": folder,
        "method": method,
        "samples_per_class": ks,
        "seeds": seeds,
        "lambda": lambdas if method == "logistic_regression" else None,
        "svm_costs": list(settings.costs) if method == "svm" else None,
        "layers": {},
    }
    try:
        for layer in layers:
            summary, line = _low_shot_at_layer(folder, layer, method, ks, seeds, lambdas, settings)
            report_layer(results_path, report, layer, summary, line)
    finally:
        shutdown_logging()
    return 0

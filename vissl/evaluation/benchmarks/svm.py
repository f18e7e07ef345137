"""The command of ``tools/train_svm.py``: linear SVM benchmark of a model's features (VISSL's
``SVM`` benchmark, e.g. VOC07)."""

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
from vissl.evaluation.svm import SvmResult, SvmSettings, evaluate_svms, svm_classes, train_svms
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.logger import shutdown_logging

logger = logging.getLogger("vissl.tools")

_SVM = "config.SVM"
RESULTS_FILE = "svm_results.json"


def result_line(result: SvmResult, layer: str, n_classes: int, n_train: int) -> str:
    """The printed result of one layer."""
    top1 = "-" if result.top1 is None else f"{result.top1:.2f}%"
    return (
        f"svm: mAP {result.mean_ap:.2f}% mAP(11-point) {result.mean_ap_11pt:.2f}% "
        f"top-1 {top1} layer={layer} classes={n_classes} train={n_train} test={result.total}"
    )


def _svm_at_layer(
    folder: str, out_dir: str, layer: str, settings: SvmSettings
) -> tuple[dict[str, Any], str]:
    data = load_split_features(folder, layer, f"{_SVM}.FEATURES.PATH")
    train, test = data["train"], data["test"]
    try:
        classes = svm_classes(train["targets"], settings.cls_list)
        if len(classes) < 2 and not settings.cls_list:
            raise ConfigError(
                f"the TRAIN features in {folder} have {len(classes)} class: the SVM benchmark "
                "needs labelled data (config.DATA.TRAIN.LABEL_SOURCES / LABEL_TYPE: standard).",
                "config.DATA.TRAIN.LABEL_TYPE",
            )
        model = train_svms(
            train["features"],
            train["targets"],
            settings,
            cache_dir=os.path.join(out_dir, f"svm_{layer}"),
            progress=True,
            desc=f"SVM {layer}",
        )
        result = evaluate_svms(model, test["features"], test["targets"])
    except ConfigError:
        raise
    except ValueError as err:  # labels that do not fit (e.g. a class without samples)
        raise ConfigError(
            f"{_SVM}.cls_list / the data: {err} (layer {layer}, features in {folder}).",
            f"{_SVM}.cls_list",
        ) from err
    n_train = len(train["features"])
    summary = {
        "mean_ap": result.mean_ap,
        "mean_ap_11pt": result.mean_ap_11pt,
        "top1": result.top1,
        "classes": model.classes,
        "per_class_ap": {str(c): ap for c, ap in result.per_class_ap.items()},
        "per_class_ap_11pt": {str(c): ap for c, ap in result.per_class_ap_11pt.items()},
        "costs": list(model.costs),
        "chosen_costs": model.chosen_costs,
        "cross_val_ap": [[None if a != a else float(a) for a in row] for row in model.cv_ap],
        "train": n_train,
        "test": result.total,
        "dim": int(model.weights.shape[1]),
    }
    return summary, result_line(result, layer, len(model.classes), n_train)


def main(argv: list[str]) -> int:
    """Extract (or read) features, train and test the SVMs, print the result last."""
    root, cfg = hydra_compose_and_validate(argv)
    svm = cfg.SVM
    settings = SvmSettings.from_config(svm)
    layers = feature_layers(cfg, str(svm.FEATURE_TYPE), f"{_SVM}.FEATURE_TYPE")
    features_key = f"{_SVM}.FEATURES.PATH"
    folder = extract_or_locate_features(
        cfg, int(root.node_id), str(svm.FEATURES.PATH), features_key
    )
    if folder is None:
        print(f"svm: node {root.node_id}: features extracted; node 0 trains the SVMs.")
        return 0
    out_dir = setup_tool_logging(cfg)
    results_path = os.path.join(out_dir, RESULTS_FILE)
    report: dict[str, Any] = {
        "benchmark": "svm",
        "weights": str(cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE),
        "features": folder,
        "settings": {
            "costs": list(settings.costs),
            "normalize": settings.normalize,
            "loss": settings.loss,
            "penalty": settings.penalty,
            "dual": settings.dual,
            "max_iter": settings.max_iter,
            "cross_val_folds": settings.cross_val_folds,
            "cls_list": list(settings.cls_list),
        },
        "layers": {},
    }
    try:
        for layer in layers:
            summary, line = _svm_at_layer(folder, out_dir, layer, settings)
            report_layer(results_path, report, layer, summary, line)
    finally:
        shutdown_logging()
    return 0

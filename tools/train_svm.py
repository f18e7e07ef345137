#!/usr/bin/env python3
"""Linear SVM benchmark of a model's features (VISSL's ``SVM`` benchmark, e.g. VOC07).

    python tools/train_svm.py \\
        config=benchmark/svm/digits/svm_digits_quick_start \\
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> \\
        [config.SVM.costs.costs_list=[0.1,1.0]] [config.SVM.FEATURES.PATH=<folder>]

TRAIN and TEST features of the checkpoint (an empty ``PARAMS_FILE``: a randomly
initialised model) are extracted with the ``extract_features`` engine into
``EXTRACT_FEATURES.OUTPUT_DIR`` (or ``CHECKPOINT.DIR``); with
``config.SVM.FEATURES.PATH=<folder>`` features extracted before are read instead.
Then, for each layer (``SVM.FEATURE_TYPE``: trunk, heads, a pooled layer, or ``""`` for
every layer the config extracts), one linear SVM per class is trained on TRAIN, its cost
picked from the sweep ``SVM.costs`` by cross-validated AP, and evaluated on TEST
(:mod:`vissl.utils.svm_utils`). Targets are class indices or VISSL's multi-label VOC07
arrays (1 present, 0 absent, -1 ignored; top-1 is then not defined).

One result line is printed per layer; the last line of the output is the result (of the
last layer)::

    svm: mAP 93.05% mAP(11-point) 92.31% top-1 90.53% layer=trunk classes=10 train=1438 test=359

``mAP``: the area under the interpolated precision-recall curve (VISSL's measure);
``mAP(11-point)``: the PASCAL VOC 2007 devkit's. The results (per-class APs, chosen costs,
cross-validated APs) go to ``CHECKPOINT.DIR/svm_results.json``; each class's SVM to
``CHECKPOINT.DIR/svm_<layer>/cls<c>.npz``, reused by a later run on the same features
and settings unless ``config.SVM.force_retrain=True``.
Exit codes: 0 done, 1 a worker failed, 2 a config or input error (one line on stderr).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from types import ModuleType
from typing import Any

from vissl.errors import ConfigError
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.logger import shutdown_logging
from vissl.utils.svm_utils import SvmResult, SvmSettings, evaluate_svms, svm_classes, train_svms

logger = logging.getLogger("vissl.tools")

_SVM = "config.SVM"
RESULTS_FILE = "svm_results.json"


def _feature_tools() -> ModuleType:
    """The shared feature helpers of ``tools/nearest_neighbor_test.py``."""
    name = "vissl_tools_nearest_neighbor_test"
    if name in sys.modules:
        return sys.modules[name]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nearest_neighbor_test.py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ft = _feature_tools()


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
    data = ft.load_split_features(folder, layer, f"{_SVM}.FEATURES.PATH")
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
    layers = ft.feature_layers(cfg, str(svm.FEATURE_TYPE), f"{_SVM}.FEATURE_TYPE")
    features_key = f"{_SVM}.FEATURES.PATH"
    folder = ft.extract_or_locate_features(
        cfg, int(root.node_id), str(svm.FEATURES.PATH), features_key
    )
    if folder is None:
        print(f"svm: node {root.node_id}: features extracted; node 0 trains the SVMs.")
        return 0
    out_dir = ft.setup_tool_logging(cfg)
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
            report["layers"][layer] = summary
            ft.write_results_json(results_path, report)
            logger.info("results saved to %s", results_path)
            print(line, flush=True)
    finally:
        shutdown_logging()
    return 0


if __name__ == "__main__":
    sys.exit(ft.run_tool("train_svm", main, sys.argv[1:]))

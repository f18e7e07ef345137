"""The command of ``tools/train_svm_low_shot.py``: VISSL's low-shot SVM benchmark on VOC07
(``SVM.low_shot``)."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from vissl.errors import ConfigError
from vissl.evaluation.cli import setup_tool_logging, write_results_json
from vissl.evaluation.features import (
    extract_or_locate_features,
    feature_layers,
    load_split_features,
)
from vissl.evaluation.svm import SvmSettings
from vissl.evaluation.svm_low_shot import aggregate, class_aps_by_cost, low_shot_targets
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.logger import shutdown_logging

logger = logging.getLogger("vissl.tools")

_KEY = "config.SVM.low_shot"
RESULTS_FILE = "svm_low_shot_results.json"


def _positive_ints(values: Any, key: str) -> list[int]:
    items = list(values) if isinstance(values, list | tuple) else [values]
    if not items or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items
    ):
        raise ConfigError(
            f"{_KEY}.{key} must be a list of integers > 0, got {values!r}.", f"{_KEY}.{key}"
        )
    return [int(v) for v in items]


def low_shot_at_layer(
    folder: str, out_dir: str, layer: str, cfg: Any, settings: SvmSettings
) -> dict[str, Any]:
    """Draw, train, test and aggregate for one layer; returns VISSL's results dict."""
    low = cfg.SVM.low_shot
    k_values = _positive_ints(low.k_values, "k_values")
    sample_inds = _positive_ints(low.sample_inds, "sample_inds")
    data = load_split_features(folder, layer, "config.SVM.FEATURES.PATH")
    train, test = data["train"], data["test"]
    if np.asarray(test["targets"]).ndim != 2:
        raise ConfigError(
            f"{_KEY}: the TEST targets must be (N, C) multi-label rows as VOC07's, got shape "
            f"{np.asarray(test['targets']).shape}.",
            f"{_KEY}.dataset_name",
        )
    layer_dir = os.path.join(out_dir, f"svm_low_shot_{layer}")
    os.makedirs(layer_dir, exist_ok=True)
    mean_aps = np.zeros((len(k_values), len(sample_inds), len(settings.costs)))
    for i, k in enumerate(k_values):
        for j, sample in enumerate(sample_inds):
            rng = np.random.default_rng([int(cfg.SEED_VALUE), sample, k])
            targets = low_shot_targets(train["targets"], k, rng)
            np.save(os.path.join(layer_dir, f"{layer}_sample{sample}_k{k}.npy"), targets)
            aps = class_aps_by_cost(
                train["features"], targets, test["features"], test["targets"], settings
            )
            mean_aps[i, j] = aps.mean(axis=0)
            np.save(
                os.path.join(layer_dir, f"test_ap_sample{sample}_k{k}.npy"), mean_aps[i, j][None]
            )
            logger.info("layer %s k=%d draw %d: mAP per cost %s", layer, k, sample, mean_aps[i, j])
    stats, matrices = aggregate(mean_aps, k_values, settings.costs)
    for name, matrix in matrices.items():
        np.save(os.path.join(layer_dir, f"test_ap_{name}.npy"), matrix)
    results = {}
    for st in stats:
        results[f"k={st.k}"] = {"mean": st.mean, "min": st.min, "max": st.max, "std": st.std}
        print(
            f"svm_low_shot: k={st.k} mAP mean {st.mean:.2f} min {st.min:.2f} max {st.max:.2f} "
            f"std {st.std:.2f} cost={st.cost:g} layer={layer}",
            flush=True,
        )
    return results


def main(argv: list[str]) -> int:
    """Extract (or read) features, run the low-shot SVMs, print the results last."""
    root, cfg = hydra_compose_and_validate(argv)
    dataset = str(cfg.SVM.low_shot.dataset_name)
    if "voc" not in dataset:
        raise ConfigError(
            f"{_KEY}.dataset_name={dataset!r}: only VOC-style multi-label low-shot SVMs are "
            "supported (VISSL's Places205 variant re-extracts features per draw); for "
            "single-label low-shot benchmarks use tools/low_shot_test.py.",
            f"{_KEY}.dataset_name",
        )
    settings = SvmSettings.from_config(cfg.SVM)
    layers = feature_layers(cfg, str(cfg.SVM.FEATURE_TYPE), "config.SVM.FEATURE_TYPE")
    folder = extract_or_locate_features(
        cfg, int(root.node_id), str(cfg.SVM.FEATURES.PATH), "config.SVM.FEATURES.PATH"
    )
    if folder is None:
        print(f"svm_low_shot: node {root.node_id}: features extracted; node 0 evaluates.")
        return 0
    out_dir = setup_tool_logging(cfg)
    try:
        results = {
            layer: low_shot_at_layer(folder, out_dir, layer, cfg, settings) for layer in layers
        }
        write_results_json(os.path.join(out_dir, RESULTS_FILE), results)
    finally:
        shutdown_logging()
    return 0

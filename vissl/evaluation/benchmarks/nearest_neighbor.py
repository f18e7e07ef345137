"""The command of ``tools/nearest_neighbor_test.py``: weighted kNN evaluation of a model's features
(VISSL's ``NEAREST_NEIGHBOR`` benchmark)."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from vissl.errors import ConfigError
from vissl.evaluation.cli import setup_tool_logging
from vissl.evaluation.features import (
    extract_or_locate_features,
    feature_layers,
    load_split_features,
)
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.logger import shutdown_logging

logger = logging.getLogger("vissl.tools")

_NN = "config.NEAREST_NEIGHBOR"


def _is_pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def check_nn_settings(nn: Any) -> tuple[list[int], float, str]:
    """``(topks, sigma, device)`` of ``NEAREST_NEIGHBOR``.

    Raises:
        ConfigError: a bad ``TOPK`` or ``SIGMA``, or ``USE_CUDA`` without a CUDA device.
    """
    topk, sigma = nn.TOPK, nn.SIGMA
    topks = list(topk) if isinstance(topk, list | tuple) else [topk]
    if not topks or not all(_is_pos_int(k) for k in topks):
        raise ConfigError(
            f"{_NN}.TOPK must be a positive integer or a non-empty list of them; got {topk!r}.",
            f"{_NN}.TOPK",
        )
    if isinstance(sigma, bool) or not isinstance(sigma, int | float) or not sigma > 0:
        raise ConfigError(f"{_NN}.SIGMA must be a positive number; got {sigma!r}.", f"{_NN}.SIGMA")
    device = "cpu"
    if nn.USE_CUDA:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                f"{_NN}.USE_CUDA=True but no CUDA device is available; set it to False to run "
                "the kNN on the CPU.",
                f"{_NN}.USE_CUDA",
            )
        device = "cuda"
    return topks, float(sigma), device


def _save_knn_outputs(
    out_dir: str, layer: str, result: Any, targets: np.ndarray, inds: np.ndarray
) -> None:
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, f"kNN_{layer}_output_predictions.npy"), result.predictions)
    np.save(os.path.join(out_dir, f"kNN_{layer}_output_targets.npy"), targets)
    np.save(os.path.join(out_dir, f"kNN_{layer}_output_image_indices.npy"), inds)


def _knn_at_layer(
    folder: str, out_dir: str, layer: str, topks: list[int], sigma: float, device: str, nn: Any
) -> None:
    from vissl.evaluation.knn import auto_chunk_sizes, knn_classify

    data = load_split_features(folder, layer, f"{_NN}.FEATURES.PATH")
    train, test = data["train"], data["test"]
    n_train = len(train["features"])
    q_chunk, m_chunk = auto_chunk_sizes(n_train, bool(nn.OPTIMIZE_MEMORY))
    for topk in topks:
        if topk > n_train:
            logger.warning(
                "%s.TOPK=%d is more than the %d TRAIN samples: every TRAIN sample votes.",
                _NN,
                topk,
                n_train,
            )
        logger.info(
            "kNN on %s features: %d TRAIN x %d TEST, dim %d, k=%d, sigma=%g, l2 norm %s, %s",
            layer,
            n_train,
            len(test["features"]),
            train["features"].reshape(n_train, -1).shape[1],
            topk,
            sigma,
            bool(nn.L2_NORM_FEATS),
            device,
        )
        result = knn_classify(
            train["features"],
            train["targets"],
            test["features"],
            test["targets"],
            k=topk,
            sigma=sigma,
            l2_normalize=bool(nn.L2_NORM_FEATS),
            query_chunk_size=q_chunk,
            memory_chunk_size=m_chunk,
            device=device,
            progress=True,
        )
        _save_knn_outputs(out_dir, layer, result, test["targets"], test["inds"])
        logger.info("predictions saved to %s/kNN_%s_output_*.npy", out_dir, layer)
        print(
            f"nearest_neighbor: top-1 {result.top1:.2f}% (error {result.top1_error:.2f}%) "
            f"top-5 {result.top5:.2f}% k={result.k} sigma={result.sigma:g} layer={layer} "
            f"train={n_train} test={result.total}",
            flush=True,
        )


def main(argv: list[str]) -> int:
    """Extract (or read) features, run the weighted kNN, print the result last."""
    root, cfg = hydra_compose_and_validate(argv)
    nn = cfg.NEAREST_NEIGHBOR
    topks, sigma, device = check_nn_settings(nn)
    layers = feature_layers(cfg, str(nn.FEATURE_TYPE), f"{_NN}.FEATURE_TYPE")
    features_key = f"{_NN}.FEATURES.PATH"
    folder = extract_or_locate_features(cfg, int(root.node_id), str(nn.FEATURES.PATH), features_key)
    if folder is None:
        print(f"nearest_neighbor: node {root.node_id}: features extracted; node 0 evaluates.")
        return 0
    out_dir = setup_tool_logging(cfg)
    try:
        for layer in layers:
            _knn_at_layer(folder, out_dir, layer, topks, sigma, device, nn)
    finally:
        shutdown_logging()
    return 0

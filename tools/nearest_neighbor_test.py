#!/usr/bin/env python3
"""Weighted kNN evaluation of a model's features (VISSL's ``NEAREST_NEIGHBOR`` benchmark).

    python tools/nearest_neighbor_test.py \
        config=benchmark/nearest_neighbor/digits/nn_digits_quick_start \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> \
        [config.DISTRIBUTED.NUM_PROC_PER_NODE=2] [config.NEAREST_NEIGHBOR.TOPK=20]

TRAIN and TEST features of the checkpoint are extracted with the ``extract_features``
engine (as many processes as the config asks for) into ``EXTRACT_FEATURES.OUTPUT_DIR`` (or
``CHECKPOINT.DIR``); with ``config.NEAREST_NEIGHBOR.FEATURES.PATH=<folder>`` features
extracted before are read instead. Every TEST sample is then classified by the
``exp(similarity / SIGMA)``-weighted votes of its ``TOPK`` nearest TRAIN samples
(:mod:`vissl.utils.knn`). Keys: ``NEAREST_NEIGHBOR.{TOPK (an integer or, as in VISSL, a
list of them), SIGMA, L2_NORM_FEATS, USE_CUDA, FEATURE_TYPE, OPTIMIZE_MEMORY,
FEATURES.PATH}``. ``FEATURE_TYPE``: ``trunk``, ``heads``, a layer of
``MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP``, or ``""`` for VISSL's
choice: every layer the config's ``FEATURE_EVAL_SETTINGS`` extract (the pooled layers, else
``trunk`` with ``EXTRACT_TRUNK_FEATURES_ONLY``, else ``heads``). A ``TOPK`` larger than the
number of TRAIN samples uses them all (a warning says so).

One result line is printed per layer and ``k``; the last line of the output is the
result (of the last layer and ``k``)::

    nearest_neighbor: top-1 97.49% (error 2.51%) top-5 99.72% k=20 sigma=0.07 layer=trunk ...

Top-5 is 100% when there are at most 5 classes. The predictions are saved in VISSL's files
``kNN_{layer}_output_{predictions,targets,image_indices}.npy`` in ``CHECKPOINT.DIR``
(one row per TEST sample in dataset-index order: the 5 best classes, best first (VISSL
saved every class), the target, the dataset index; with several ``TOPK`` the last one's).
Exit codes: 0 done, 1 a worker failed, 2 a config or input error (one line on stderr).

This module also holds the feature helpers of ``tools/train_svm.py`` and
``tools/low_shot_test.py``.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from vissl.errors import ConfigError, VisslError
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.logger import shutdown_logging

logger = logging.getLogger("vissl.tools")

_FEATURE_FILE = re.compile(r"^rank\d+_chunk\d+_(train|test)_(.+)_features\.npy$")
_FE_KEY = "config.MODEL.FEATURE_EVAL_SETTINGS"


# ----------------------------------------------------------------- shared feature helpers
def layers_in_folder(folder: str) -> list[str]:
    """Layers with extracted TRAIN and TEST features in ``folder``."""
    found: dict[str, set[str]] = {}
    for name in os.listdir(folder):
        m = _FEATURE_FILE.match(name)
        if m:
            found.setdefault(m.group(2), set()).add(m.group(1))
    return sorted(layer for layer, splits in found.items() if splits == {"train", "test"})


def pool_layer_names(cfg: Any) -> list[str]:
    """Layer names of ``LINEAR_EVAL_FEAT_POOL_OPS_MAP`` (in feature-evaluation mode)."""
    from vissl.models.model_helpers import get_trunk_output_feature_names

    return list(get_trunk_output_feature_names(cfg.MODEL))


def extracted_layer_names(cfg: Any) -> list[str]:
    """The layers the ``extract_features`` engine writes for this config."""
    names = pool_layer_names(cfg)
    if names:
        return names
    fe = cfg.MODEL.FEATURE_EVAL_SETTINGS
    return ["trunk"] if fe.EVAL_MODE_ON and fe.EXTRACT_TRUNK_FEATURES_ONLY else ["heads"]


def select_feature_type(cfg: Any, feature_type: str, key: str) -> str:
    """Set ``MODEL.FEATURE_EVAL_SETTINGS`` so that extraction writes ``feature_type``.

    Raises:
        ConfigError: ``feature_type`` is neither trunk, heads nor a pooled layer.
    """
    fe = cfg.MODEL.FEATURE_EVAL_SETTINGS
    if feature_type == "trunk":
        fe.EVAL_MODE_ON, fe.EXTRACT_TRUNK_FEATURES_ONLY = True, True
        fe.LINEAR_EVAL_FEAT_POOL_OPS_MAP = []
    elif feature_type == "heads":
        fe.EVAL_MODE_ON, fe.EXTRACT_TRUNK_FEATURES_ONLY = True, False
        fe.LINEAR_EVAL_FEAT_POOL_OPS_MAP = []
    else:
        pooled = [item[0] for item in fe.LINEAR_EVAL_FEAT_POOL_OPS_MAP]
        if feature_type not in pooled:
            raise ConfigError(
                f"{key}={feature_type!r} is not a feature type: use trunk, heads, or a layer "
                f"of {_FE_KEY}.LINEAR_EVAL_FEAT_POOL_OPS_MAP ({pooled or 'empty'}).",
                key,
            )
        fe.EVAL_MODE_ON = True
    return feature_type


def feature_layers(cfg: Any, feature_type: str, key: str) -> list[str]:
    """The layers to evaluate: ``[feature_type]`` (see :func:`select_feature_type`), or for
    ``""`` VISSL's choice, :func:`extracted_layer_names` (the config is left as it is)."""
    if feature_type == "":
        return extracted_layer_names(cfg)
    return [select_feature_type(cfg, feature_type, key)]


def check_weights_file(cfg: Any) -> None:
    """A given ``MODEL.WEIGHTS_INIT.PARAMS_FILE`` must exist; none at all is a warning."""
    path = str(cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE)
    if path and not os.path.isfile(path):
        raise ConfigError(
            f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={path!r}: no such file; give the "
            "checkpoint to evaluate (e.g. <run>/model_final_checkpoint_phase<N>.torch).",
            "config.MODEL.WEIGHTS_INIT.PARAMS_FILE",
        )
    if not path:
        print(
            "warning: config.MODEL.WEIGHTS_INIT.PARAMS_FILE is empty: evaluating a randomly "
            "initialised model.",
            file=sys.stderr,
        )


def _remove_stale_features(folder: str) -> None:
    stale = [
        p
        for p in glob.glob(os.path.join(folder, "rank*_chunk*_*.npy"))
        if re.match(
            r"^rank\d+_chunk\d+_(train|test)_.+_(features|targets|inds)\.npy$", os.path.basename(p)
        )
    ]
    if stale:
        logger.info("removing %d feature files of an earlier extraction in %s", len(stale), folder)
    for path in stale:
        os.remove(path)


def extract_or_locate_features(
    cfg: Any, node_id: int, features_path: str, features_key: str
) -> str | None:
    """The folder holding TRAIN/TEST features: ``features_path`` or a fresh extraction.

    Returns None on nodes other than 0 of a multi-node run (node 0 evaluates).

    Raises:
        ConfigError: ``features_path`` is not a folder, or SLURM is asked for.
    """
    if features_path:
        if not os.path.isdir(features_path):
            raise ConfigError(
                f"{features_key}={features_path!r}: no such folder of extracted features.",
                features_key,
            )
        return os.path.abspath(features_path)
    if cfg.SLURM.USE_SLURM:
        raise ConfigError(
            "config.SLURM.USE_SLURM: the benchmark tools run where they are started; "
            "extract features on SLURM with tools/run_distributed_engines.py "
            f"engine_name=extract_features, then pass {features_key}=<folder>.",
            "config.SLURM.USE_SLURM",
        )
    check_weights_file(cfg)
    from vissl.hooks import default_hook_generator
    from vissl.utils.distributed_launcher import launch_distributed

    out_dir = os.path.abspath(str(cfg.EXTRACT_FEATURES.OUTPUT_DIR or cfg.CHECKPOINT.DIR))
    cfg.EXTRACT_FEATURES.OUTPUT_DIR = out_dir
    os.makedirs(out_dir, exist_ok=True)
    if node_id == 0:
        _remove_stale_features(out_dir)
    launch_distributed(
        cfg,
        node_id=node_id,
        engine_name="extract_features",
        hook_generator=default_hook_generator,
    )
    return out_dir if node_id == 0 else None


def load_split_features(folder: str, layer: str, features_key: str) -> dict[str, Any]:
    """``{"train": {...}, "test": {...}}`` of ``layer`` (features, targets, inds).

    Raises:
        ConfigError: no features of ``layer`` in ``folder`` (the layers found are listed).
    """
    from vissl.engines.extract_features import ExtractedFeaturesLoader

    if layer not in layers_in_folder(folder):
        raise ConfigError(
            f"no TRAIN and TEST features of layer {layer!r} in {folder} "
            f"(layers found: {layers_in_folder(folder) or 'none'}); extract them first or "
            f"point {features_key} at the right folder.",
            features_key,
        )
    return {
        split: ExtractedFeaturesLoader.load_features(folder, layer, split)
        for split in ("train", "test")
    }


def setup_tool_logging(cfg: Any) -> str:
    """Log to stdout and ``CHECKPOINT.DIR/log.txt``; returns the folder."""
    from vissl.utils.logger import setup_logging

    out_dir = os.path.abspath(str(cfg.CHECKPOINT.DIR))
    setup_logging(out_dir, 0, verbose=bool(cfg.VERBOSE))
    return out_dir


def write_results_json(path: str, data: Any) -> None:
    """Write a tool's results as JSON, atomically (temporary file, then rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def run_tool(prog: str, main: Callable[[list[str]], int], argv: Sequence[str]) -> int:
    """Run ``main(argv)``; user errors become one ``prog: error: ...`` line on stderr."""
    from vissl.utils.distributed_launcher import DistributedWorkerError

    try:
        return main(list(argv))
    except DistributedWorkerError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1
    except VisslError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2


# ----------------------------------------------------------------------------- kNN
_NN = "config.NEAREST_NEIGHBOR"


def _is_pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _check_nn_settings(nn: Any) -> tuple[list[int], float, str]:
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
    from vissl.utils.knn import auto_chunk_sizes, knn_classify

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
    topks, sigma, device = _check_nn_settings(nn)
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


if __name__ == "__main__":
    sys.exit(run_tool("nearest_neighbor_test", main, sys.argv[1:]))

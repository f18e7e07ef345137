"""The command of ``tools/extract_feature_and_rank.py``: rank a data set's images by the distance
to their nearest neighbour (VISSL's ``RANKING``)."""

from __future__ import annotations

import logging
import os
import pickle
from typing import Any

import numpy as np
import torch

from vissl.errors import ConfigError
from vissl.evaluation.cli import setup_tool_logging
from vissl.evaluation.clustering import faiss_available
from vissl.evaluation.features import extract_or_locate_features, pick_layer
from vissl.evaluation.ranking import l2_rows, nearest_neighbour_distances
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.logger import shutdown_logging

logger = logging.getLogger("vissl.tools")

_KEY = "config.RANKING"
_BACKENDS = ("faiss",)
_PARTITIONS = ("TRAIN", "TEST")


def _image_paths(cfg: Any, split: str, inds: np.ndarray) -> list[str]:
    """The image path of each dataset index (empty for sources without files)."""
    from vissl.data import build_dataset

    dataset = build_dataset(cfg, split)
    paths = dataset.get_image_paths()
    if len(paths) != 1:
        raise ConfigError(
            f"ranking reads one data source; config.DATA.{split}.DATA_SOURCES has {len(paths)}.",
            f"config.DATA.{split}.DATA_SOURCES",
        )
    files = list(paths[0])
    if not files:
        return []
    subset = getattr(dataset, "sub_set", None)
    rows = np.asarray(subset)[inds] if subset is not None else inds
    return [str(files[int(i)]) for i in rows]


def rank(cfg: Any, folder: str, out_dir: str) -> dict[str, Any]:
    """Rank the extracted features of ``folder``; write and return VISSL's dict."""
    from vissl.engines.extract_features import ExtractedFeaturesLoader

    r = cfg.RANKING
    split = str(r.FEATURES.DATA_PARTITION)
    layer = pick_layer(
        folder, split, str(r.FEATURES.LAYER_NAME), f"{_KEY}.FEATURES.LAYER_NAME", "rank", "found"
    )
    data = ExtractedFeaturesLoader.load_features(folder, layer, split)
    features = np.asarray(data["features"], dtype=np.float32).reshape(len(data["features"]), -1)
    inds = np.asarray(data["inds"], dtype=np.int64)
    logger.info("ranking %s features of layer %s: %s", split, layer, features.shape)
    if r.APPLY_PCA:
        from sklearn.decomposition import PCA

        dim = int(r.PCA_DIM)
        if not 0 < dim <= min(features.shape):
            raise ConfigError(
                f"{_KEY}.PCA_DIM={dim} must be in [1, {min(features.shape)}] for "
                f"{features.shape[0]} samples of {features.shape[1]} dimensions.",
                f"{_KEY}.PCA_DIM",
            )
        features = PCA(n_components=dim).fit_transform(l2_rows(features)).astype(np.float32)
    if r.NORMALIZE_FEATS:
        features = l2_rows(features).astype(np.float32)
    backend = str(r.RANKING_BACKEND)
    use_faiss = faiss_available()
    if not use_faiss:
        logger.warning(
            "%s.RANKING_BACKEND=faiss: faiss is not installed (pip install faiss-cpu); "
            "using an exact search in torch (the same distances).",
            _KEY,
        )
    device = "cpu"
    if r.USE_GPU:
        if not torch.cuda.is_available():
            raise ConfigError(
                f"{_KEY}.USE_GPU=True but no CUDA device is available; set it to False.",
                f"{_KEY}.USE_GPU",
            )
        device = "cuda"
    distances = nearest_neighbour_distances(features, use_faiss, device)
    order = np.argsort(-distances, kind="stable")
    paths = _image_paths(cfg, split, inds)
    result = {
        "img_paths": [paths[i] for i in order] if paths else [],
        "distances": [float(distances[i]) for i in order],
        "indices": [int(inds[i]) for i in order],
    }
    name = str(r.FEATURES.DATASET_NAME)
    path = os.path.join(out_dir, f"ranking_{name}_{split.lower()}_{backend}.pkl")
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, path)
    top = result["img_paths"][0] if paths else f"sample {result['indices'][0]}"
    print(
        f"extract_feature_and_rank: {len(order)} {split.lower()} samples ranked (layer {layer}, "
        f"dim {features.shape[1]}); most isolated {top} at {result['distances'][0]:.4f} -> "
        f"{os.path.basename(path)}",
        flush=True,
    )
    return result


def _check(r: Any) -> None:
    if str(r.RANKING_BACKEND) not in _BACKENDS:
        raise ConfigError(
            f"{_KEY}.RANKING_BACKEND={r.RANKING_BACKEND!r}: only faiss is supported (as in VISSL).",
            f"{_KEY}.RANKING_BACKEND",
        )
    if str(r.FEATURES.DATA_PARTITION) not in _PARTITIONS:
        raise ConfigError(
            f"{_KEY}.FEATURES.DATA_PARTITION={r.FEATURES.DATA_PARTITION!r}: use TRAIN or TEST.",
            f"{_KEY}.FEATURES.DATA_PARTITION",
        )
    if not str(r.FEATURES.DATASET_NAME):
        raise ConfigError(
            f"{_KEY}.FEATURES.DATASET_NAME is empty: it names the output file "
            "ranking_<name>_<split>_<backend>.pkl.",
            f"{_KEY}.FEATURES.DATASET_NAME",
        )


def main(argv: list[str]) -> int:
    """Extract (or read) the features, rank the samples, print the summary last."""
    root, cfg = hydra_compose_and_validate(argv)
    _check(cfg.RANKING)
    path_key = f"{_KEY}.FEATURES.PATH"
    folder = extract_or_locate_features(
        cfg, int(root.node_id), str(cfg.RANKING.FEATURES.PATH), path_key
    )
    if folder is None:
        print(f"extract_feature_and_rank: node {root.node_id}: features extracted; node 0 ranks.")
        return 0
    out_dir = setup_tool_logging(cfg)
    try:
        rank(cfg, folder, out_dir)
    finally:
        shutdown_logging()
    return 0

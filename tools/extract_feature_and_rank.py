#!/usr/bin/env python3
"""Rank a data set's images by the distance to their nearest neighbour (VISSL's ``RANKING``).

    python tools/extract_feature_and_rank.py config=<extraction config> \\
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> \\
        config.RANKING.FEATURES.DATASET_NAME=<name> [config.RANKING.FEATURES.LAYER_NAME=res5]

The features of the model are extracted with the ``extract_features`` engine into
``EXTRACT_FEATURES.OUTPUT_DIR`` (or ``CHECKPOINT.DIR``; ``RANKING.FEATURES.PATH=<folder>``
reads features extracted before). The features of ``RANKING.FEATURES.DATA_PARTITION``
(TRAIN | TEST) and ``LAYER_NAME`` (``""``: the only layer there) are optionally
L2-normalised and projected by a PCA to ``PCA_DIM`` dimensions (``APPLY_PCA``), then
L2-normalised (``NORMALIZE_FEATS``). Each sample's squared Euclidean distance to its
nearest other sample is found (``RANKING_BACKEND: faiss``'s flat L2 index; exact search
in torch when faiss is not installed; on the GPU with ``USE_GPU``) and the samples are
sorted from the most isolated to the least.

``CHECKPOINT.DIR/ranking_{DATASET_NAME}_{split}_{RANKING_BACKEND}.pkl`` gets VISSL's dict
``{"img_paths": [...], "distances": [...]}`` in that order, plus ``"indices"`` (the dataset
indices, for sources without image paths). The last line of the output is the summary::

    extract_feature_and_rank: 1000 train samples ranked (layer res5, dim 2048); most isolated
    /data/img_0042.jpg at 1.2034 -> ranking_mydata_train_faiss.pkl

Exit codes: 0 done, 1 a worker failed, 2 a config or input error (one line on stderr).
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import pickle
import sys
from types import ModuleType
from typing import Any

import numpy as np
import torch

from vissl.errors import ConfigError
from vissl.utils.cluster_utils import faiss_available
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.logger import shutdown_logging

logger = logging.getLogger("vissl.tools")

_KEY = "config.RANKING"
_BACKENDS = ("faiss",)
_PARTITIONS = ("TRAIN", "TEST")


def _feature_tools() -> ModuleType:
    """The shared helpers of ``tools/nearest_neighbor_test.py``."""
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


def l2_rows(x: np.ndarray) -> np.ndarray:
    """Rows divided by their norm + 1e-5 (VISSL's)."""
    return x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-5)


def nearest_neighbour_distances(
    features: np.ndarray, use_faiss: bool, device: str = "cpu", chunk: int = 4096
) -> np.ndarray:
    """Each row's squared Euclidean distance to its nearest *other* row.

    ``use_faiss``: a flat L2 index searched for 2 neighbours (the row itself and the next,
    as VISSL does); otherwise exact chunked search in torch on ``device``.
    """
    x = np.ascontiguousarray(features, dtype=np.float32)
    if len(x) < 2:
        raise ConfigError(
            f"ranking needs at least 2 samples, got {len(x)}.", f"{_KEY}.FEATURES.DATA_PARTITION"
        )
    if use_faiss:
        import faiss

        if device == "cuda":
            index = faiss.GpuIndexFlatL2(faiss.StandardGpuResources(), x.shape[1])
        else:
            index = faiss.IndexFlatL2(x.shape[1])
        index.add(x)
        distances, _ = index.search(x, 2)
        return np.asarray(distances[:, 1], dtype=np.float64)
    t = torch.from_numpy(x).to(device=device, dtype=torch.float64)
    sq = (t * t).sum(1)
    out = torch.empty(len(t), dtype=torch.float64, device=device)
    for start in range(0, len(t), chunk):
        block = t[start : start + chunk]
        d = sq[start : start + chunk, None] + sq[None, :] - 2 * block @ t.T
        rows = torch.arange(block.shape[0], device=device)
        d[rows, rows + start] = float("inf")  # not the sample itself
        out[start : start + chunk] = d.clamp(min=0).min(dim=1).values
    return out.cpu().numpy()


def _layer(folder: str, split: str, layer: str) -> str:
    stem = f"_{split.lower()}_"
    found = sorted(
        {
            os.path.basename(p).split(stem, 1)[1][: -len("_features.npy")]
            for p in glob.glob(os.path.join(folder, f"rank*_chunk*{stem}*_features.npy"))
        }
    )
    key = f"{_KEY}.FEATURES.LAYER_NAME"
    if layer:
        if layer not in found:
            raise ConfigError(
                f"{key}={layer!r}: no {split} features of that layer in {folder} (found: "
                f"{found or 'none'}).",
                key,
            )
        return layer
    if len(found) != 1:
        raise ConfigError(
            f"{key} is empty and {folder} holds {split} features of {len(found)} layers "
            f"({found or 'none'}): name the layer to rank.",
            key,
        )
    return found[0]


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
    layer = _layer(folder, split, str(r.FEATURES.LAYER_NAME))
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
    folder = ft.extract_or_locate_features(
        cfg, int(root.node_id), str(cfg.RANKING.FEATURES.PATH), path_key
    )
    if folder is None:
        print(f"extract_feature_and_rank: node {root.node_id}: features extracted; node 0 ranks.")
        return 0
    out_dir = ft.setup_tool_logging(cfg)
    try:
        rank(cfg, folder, out_dir)
    finally:
        shutdown_logging()
    return 0


if __name__ == "__main__":
    sys.exit(ft.run_tool("extract_feature_and_rank", main, sys.argv[1:]))

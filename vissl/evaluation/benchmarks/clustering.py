"""The command of ``tools/cluster_features_and_label.py``: ClusterFit step 1: cluster a model's
features with k-means, one pseudo-label per sample."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from vissl.errors import ConfigError
from vissl.evaluation.cli import setup_tool_logging
from vissl.evaluation.clustering import (
    ClusterFitSettings,
    assign_to_centroids,
    cluster_size_summary,
    fit_kmeans,
    l2_normalize,
    output_prefix,
    resolve_backend,
    sample_rows,
    save_cluster_labels,
)
from vissl.evaluation.features import (
    extract_or_locate_features,
    layers_of_split,
    pick_layer,
    select_feature_type,
)
from vissl.evaluation.pca import PCA
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.logger import shutdown_logging

logger = logging.getLogger("vissl.tools")

_KEY = "config.CLUSTERFIT"


def _pick_layer(folder: str, settings: ClusterFitSettings) -> str:
    key = f"{_KEY}.FEATURES.LAYER_NAME"
    return pick_layer(folder, settings.data_partition, settings.layer_name, key, "cluster")


def _locate_features(cfg: Any, node_id: int, settings: ClusterFitSettings) -> str | None:
    """The feature folder, after extracting into it when ``FEATURES.EXTRACT`` is set."""
    path_key = f"{_KEY}.FEATURES.PATH"
    if not settings.extract:
        return extract_or_locate_features(cfg, node_id, settings.features_path, path_key)
    if int(cfg.DISTRIBUTED.NUM_NODES) != 1:
        raise ConfigError(
            f"{_KEY}.FEATURES.EXTRACT=True runs the extraction on this machine only; with "
            f"config.DISTRIBUTED.NUM_NODES={cfg.DISTRIBUTED.NUM_NODES} extract with "
            "tools/run_distributed_engines.py engine_name=extract_features first, then set "
            f"EXTRACT=False and {path_key}=<folder>.",
            f"{_KEY}.FEATURES.EXTRACT",
        )
    if settings.layer_name:
        select_feature_type(cfg, settings.layer_name, f"{_KEY}.FEATURES.LAYER_NAME")
    cfg.EXTRACT_FEATURES.OUTPUT_DIR = os.path.abspath(settings.features_path)
    return extract_or_locate_features(cfg, node_id, "", path_key)


def _image_paths(cfg: Any, split: str) -> list[str]:
    """The image paths of ``split``'s first data source (empty for in-memory sources)."""
    from vissl.data import build_dataset

    paths = build_dataset(cfg, split).get_image_paths()
    return list(paths[0]) if paths else []


def cluster_features(cfg: Any, folder: str, settings: ClusterFitSettings) -> list[str]:
    """Fit the centroids, label every sample of the partitions, write the files.

    Returns the printed result lines (one per split).
    """
    from vissl.engines.extract_features import ExtractedFeaturesLoader

    layer = _pick_layer(folder, settings)
    backend = resolve_backend(settings.backend)
    fit = ExtractedFeaturesLoader.load_features(folder, layer, settings.data_partition)
    features = l2_normalize(fit["features"])
    pca = None
    if settings.dim_reduction > 0:
        if settings.dim_reduction > features.shape[1]:
            raise ConfigError(
                f"{_KEY}.FEATURES.DIMENSIONALITY_REDUCTION={settings.dim_reduction} is larger "
                f"than the {features.shape[1]} dimensions of layer {layer!r}.",
                f"{_KEY}.FEATURES.DIMENSIONALITY_REDUCTION",
            )
        pca = PCA(settings.dim_reduction)
        features = pca.fit_transform(features)
    dim = int(features.shape[1])
    rows = sample_rows(len(features), settings.data_limit, settings.seed)
    logger.info(
        "clustering %d of %d %s features (layer %s, %d dims) into %d clusters (%s, %d iterations)",
        len(rows),
        len(features),
        settings.data_partition,
        layer,
        dim,
        settings.num_clusters,
        backend,
        settings.num_iter,
    )
    centroids = fit_kmeans(
        features[rows], settings.num_clusters, settings.num_iter, settings.seed, backend
    )
    lines = []
    out_dir = os.path.abspath(settings.output_dir)
    for split in (settings.data_partition, settings.test_partition):
        if not split:
            continue
        if split == settings.data_partition:
            data, split_features = fit, features
        else:
            if layer not in layers_of_split(folder, split):
                raise ConfigError(
                    f"{_KEY}.FEATURES.TEST_PARTITION={split}: no {split} features of layer "
                    f"{layer!r} in {folder}; extract them or set TEST_PARTITION to ''.",
                    f"{_KEY}.FEATURES.TEST_PARTITION",
                )
            data = ExtractedFeaturesLoader.load_features(folder, layer, split)
            split_features = l2_normalize(data["features"])
            if pca is not None:
                split_features = pca.transform(split_features)
        labels, distances = assign_to_centroids(split_features, centroids)
        inds = np.asarray(data["inds"], dtype=np.int64)
        image_paths = _image_paths(cfg, split)
        if image_paths and int(inds.max(initial=-1)) >= len(image_paths):
            raise ConfigError(
                f"the {split} features in {folder} index sample {int(inds.max())} but "
                f"config.DATA.{split} has {len(image_paths)} images: give the data settings "
                "the features were extracted with.",
                f"config.DATA.{split}",
            )
        if not np.array_equal(inds, np.arange(len(inds))):
            logger.warning(
                "%s: the features cover %d samples, not every index 0..N-1; the labels "
                "file lists them in sample_indices order (see the .pkl).",
                split,
                len(inds),
            )
        written = save_cluster_labels(
            out_dir,
            output_prefix(settings, split, layer, dim),
            inds,
            labels,
            distances,
            centroids,
            image_paths,
        )
        summary = cluster_size_summary(labels, settings.num_clusters)
        logger.info("%s: %s; wrote %s", split, summary, ", ".join(written.values()))
        lines.append(
            f"cluster_features_and_label: {split} {len(labels)} samples -> "
            f"{settings.num_clusters} clusters ({summary}) layer={layer} dim={dim} "
            f"labels={written['labels']}"
        )
    return lines


def main(argv: list[str]) -> int:
    """Extract (or read) the features, cluster them, write the pseudo-labels."""
    root, cfg = hydra_compose_and_validate(argv)
    settings = ClusterFitSettings.from_config(cfg.CLUSTERFIT)
    folder = _locate_features(cfg, int(root.node_id), settings)
    if folder is None:
        print(f"cluster_features_and_label: node {root.node_id}: features extracted.")
        return 0
    setup_tool_logging(cfg)
    try:
        for line in cluster_features(cfg, folder, settings):
            print(line, flush=True)
    finally:
        shutdown_logging()
    return 0

#!/usr/bin/env python3
"""ClusterFit step 1: cluster a model's features with k-means, one pseudo-label per sample.

    python tools/cluster_features_and_label.py \\
        config=pretrain/clusterfit/cluster_features_resnet_8gpu_imagenet \\
        config.CLUSTERFIT.FEATURES.PATH=/path/to/extracted/features \\
        config.CLUSTERFIT.FEATURES.LAYER_NAME=res5 \\
        config.CLUSTERFIT.OUTPUT_DIR=/path/to/output/dataset \\
        config.CLUSTERFIT.NUM_CLUSTERS=16000 config.CLUSTERFIT.FEATURES.DATASET_NAME=imagenet1k

With ``config.CLUSTERFIT.FEATURES.EXTRACT=True`` the features of the model in
``MODEL.WEIGHTS_INIT.PARAMS_FILE`` are extracted first (the ``extract_features`` engine,
one node, as many processes as the config asks for) into ``CLUSTERFIT.FEATURES.PATH``;
otherwise the features there are read (``rank*_chunk*_{split}_{layer}_features.npy``).

The features of ``FEATURES.DATA_PARTITION`` are L2-normalised, PCA-whitened to
``FEATURES.DIMENSIONALITY_REDUCTION`` dimensions (0: not reduced), ``DATA_LIMIT`` of them
(-1: all) fit ``NUM_CLUSTERS`` centroids in ``NUM_ITER`` k-means iterations
(``CLUSTER_BACKEND``: faiss, or scikit-learn when faiss is not installed), and every sample
of ``DATA_PARTITION`` and ``TEST_PARTITION`` is labelled with its nearest centroid
(:mod:`vissl.evaluation.clustering`). Per split, VISSL's files go to ``OUTPUT_DIR``::

    {DATASET_NAME}_{split}_{LAYER}_N{NUM_CLUSTERS}_D{dim}.pkl         indices, labels,
                                                                      centroids, distances,
                                                                      image paths
    {DATASET_NAME}_{split}_{LAYER}_N{NUM_CLUSTERS}_D{dim}_labels.npy  int64 labels
    {DATASET_NAME}_{split}_{LAYER}_N{NUM_CLUSTERS}_D{dim}_images.npy  image paths (sources
                                                                      with paths only)

The labels are in dataset-index order, so step 2 (a classifier trained from scratch on
them) reads them as a ``disk_filelist`` label source next to the same data source::

    config.DATA.TRAIN.LABEL_SOURCES=[disk_filelist] config.DATA.TRAIN.LABEL_PATHS=[<labels.npy>]

or, with the ``_images.npy``, as a ``disk_filelist`` data set of its own. One line per
split is printed; exit codes: 0 done, 1 a worker failed, 2 a config or input error (one
line on stderr).
"""

import sys

from vissl.evaluation.benchmarks.clustering import main
from vissl.evaluation.cli import run_tool

if __name__ == "__main__":
    sys.exit(run_tool("cluster_features_and_label", main, sys.argv[1:]))

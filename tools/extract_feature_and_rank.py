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

import sys

from vissl.evaluation.benchmarks.ranking import main
from vissl.evaluation.cli import run_tool

if __name__ == "__main__":
    sys.exit(run_tool("extract_feature_and_rank", main, sys.argv[1:]))

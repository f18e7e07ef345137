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
(:mod:`vissl.evaluation.knn`). Keys: ``NEAREST_NEIGHBOR.{TOPK (an integer or, as in VISSL, a
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
"""

import sys

from vissl.evaluation.benchmarks.nearest_neighbor import main
from vissl.evaluation.cli import run_tool

if __name__ == "__main__":
    sys.exit(run_tool("nearest_neighbor_test", main, sys.argv[1:]))

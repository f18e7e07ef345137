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
(:mod:`vissl.evaluation.svm`). Targets are class indices or VISSL's multi-label VOC07
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

import sys

from vissl.evaluation.benchmarks.svm import main
from vissl.evaluation.cli import run_tool

if __name__ == "__main__":
    sys.exit(run_tool("train_svm", main, sys.argv[1:]))

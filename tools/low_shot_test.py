#!/usr/bin/env python3
"""Low-shot benchmark of a model's features (VISSL's ``LOW_SHOT_BENCHMARK``).

    python tools/low_shot_test.py \\
        config=benchmark/low_shot_transfer/digits/low_shot_digits_quick_start \\
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> \\
        [config.LOW_SHOT_BENCHMARK.SAMPLES_PER_CLASS=[1,5]] \\
        [config.LOW_SHOT_BENCHMARK.METHOD=svm] [config.LOW_SHOT_BENCHMARK.FEATURES.PATH=<folder>]

TRAIN and TEST features of the checkpoint (an empty ``PARAMS_FILE``: a randomly
initialised model) are extracted once with the ``extract_features`` engine into
``EXTRACT_FEATURES.OUTPUT_DIR`` (or ``CHECKPOINT.DIR``); with
``config.LOW_SHOT_BENCHMARK.FEATURES.PATH=<folder>`` features extracted before are read
instead. Then, for each ``k`` of ``SAMPLES_PER_CLASS`` and each seed of
``LOGISTIC_REGRESSION.SEEDS``, ``k`` TRAIN samples of every class are drawn, a linear
classifier is trained on them alone (``METHOD``: ``logistic_regression`` with
``LOGISTIC_REGRESSION.LAMBDA``, or ``svm`` with the ``SVM`` section) and its top-1 is
measured on all of TEST (:mod:`vissl.evaluation.low_shot`). Layers:
``LOW_SHOT_BENCHMARK.FEATURE_TYPE`` (trunk, heads, a pooled layer, or ``""`` for every
layer the config extracts).

VISSL re-extracted the features of a ``DATA_LIMIT`` subset for every seed; drawing the
samples from features extracted once gives the same kind of draws at a fraction of the cost.

One line per ``k`` and a summary line per layer are printed; the last line of the output
is the summary of the last layer (mean ± standard deviation over the seeds)::

    low_shot: top-1 k=1 41.23±3.10% k=2 55.10±2.40% ... method=logistic_regression seeds=5 layer=trunk train=1438 test=359

The results (every draw's accuracy and chosen ``LAMBDA`` or cost; with ``svm``, its mAP
too) go to
``CHECKPOINT.DIR/low_shot_results.json``.
Exit codes: 0 done, 1 a worker failed, 2 a config or input error (one line on stderr).
"""

import sys

from vissl.evaluation.benchmarks.low_shot import main
from vissl.evaluation.cli import run_tool

if __name__ == "__main__":
    sys.exit(run_tool("low_shot_test", main, sys.argv[1:]))

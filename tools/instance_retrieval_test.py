#!/usr/bin/env python3
"""Instance retrieval on Revisited Oxford / Paris (VISSL's ``IMG_RETRIEVAL`` benchmark).

    python tools/instance_retrieval_test.py \\
        config=benchmark/instance_retrieval/eval_resnet_1gpu_roxford \\
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> \\
        config.IMG_RETRIEVAL.DATASET_PATH=/path/to/datasets

``DATASET_PATH/<EVAL_DATASET_NAME>/`` holds the published ``gnd_<name>.pkl`` (``imlist``,
``qimlist``, and per query ``easy``/``hard``/``junk`` database indices and a ``bbx``)
and the images ``jpg/<name>.jpg`` (:mod:`vissl.evaluation.retrieval.data`).
Every image (larger side resized to ``RESIZE_IMG``, ImageNet normalisation; queries
cropped to their box with ``CROP_QUERY_ROI``) goes through the model built from
``config.MODEL`` (its first output: a trunk feature map with
``FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY`` and ``LINEAR_EVAL_FEAT_POOL_OPS_MAP``),
at each of ``IMG_SCALINGS``, and becomes a descriptor (``FEATS_PROCESSING_TYPE``: ``rmac``
regional max-pooling, ``gem`` generalised-mean pooling, or ``""``: the maps averaged
and flattened), L2-normalised with ``NORMALIZE_FEATURES``. With ``TRAIN_PCA_WHITENING``
a PCA whitening to ``N_PCA`` dimensions is fitted on the descriptors of
``TRAIN_DATASET_NAME`` (R-MAC: of its regions) and applied. The database is ranked for
each query by ``SIMILARITY_MEASURE`` and scored with the revisited protocol: mAP and
mean precision@{1,5,10} in the Easy, Medium and Hard setups, junk images ignored
(:mod:`vissl.evaluation.retrieval.evaluate`).

The last line of the output is the result::

    instance_retrieval: roxford5k mAP E 72.10% M 53.04% H 22.57% queries=70 database=4993

With ``SAVE_RETRIEVAL_RANKINGS_SCORES`` (default) ``CHECKPOINT.DIR`` gets VISSL's
``metrics.json`` (``{"mAP": {"e", "m", "h"}, "mp@k": {"k", "e", "m", "h"}}``, fractions;
null where no query of a setup has a positive), ``rankings.json`` (per query, the
database indices from most to least similar) and ``similarity_scores.json`` (a row per
database image, a column per query, as VISSL wrote it). ``SAVE_FEATURES`` writes the
descriptors to ``CHECKPOINT.DIR/features/``. The model runs on the GPU with
``MACHINE.DEVICE=gpu``, else on the CPU.
Exit codes: 0 done, 2 a config or input error (one line on stderr).
"""

import sys

from vissl.evaluation.benchmarks.retrieval import main
from vissl.evaluation.cli import run_tool

if __name__ == "__main__":
    sys.exit(run_tool("instance_retrieval_test", main, sys.argv[1:]))

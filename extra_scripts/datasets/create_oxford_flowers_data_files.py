#!/usr/bin/env python3
"""Write Oxford Flowers-102 as VISSL's ``oxford_flowers_folder``.

Reads the published files (102flowers.tgz, imagelabels.mat, setid.mat) in INPUT::

    INPUT/jpg/image_00001.jpg
    INPUT/imagelabels.mat     "labels": 1 x N, the class (1..102) of image i
    INPUT/setid.mat           "trnid", "valid", "tstid": 1 x n image numbers

and writes ``OUTPUT/train/<class>/`` (trnid and valid, as VISSL) and ``OUTPUT/test/<class>/``
(tstid); class folders are named 001 to 102, so their sorted order is the data set's.

examples:
  python extra_scripts/datasets/create_oxford_flowers_data_files.py -i /data/flowers102 -o /data/oxford_flowers

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import scipy.io

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, ScriptError, require_file, run

SPLITS = {"train": ("trnid", "valid"), "test": ("tstid",)}


def _load(path: str, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    try:
        data = scipy.io.loadmat(require_file(path, f"a .mat file with {', '.join(keys)}"))
        return {k: np.asarray(data[k]).reshape(-1).astype(np.int64) for k in keys}
    except (ValueError, KeyError, OSError) as err:
        raise ScriptError(f"{path} holds no {', '.join(keys)}: {err}") from err


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    labels = _load(os.path.join(args.input, "imagelabels.mat"), ("labels",))["labels"]
    set_ids = _load(os.path.join(args.input, "setid.mat"), ("trnid", "valid", "tstid"))
    splits: dict[str, list[Sample]] = {}
    for split, keys in SPLITS.items():
        splits[split] = [
            Sample(
                os.path.join(args.input, "jpg", f"image_{int(i):05d}.jpg"),
                f"{int(labels[int(i) - 1]):03d}",
            )
            for key in keys
            for i in set_ids[key]
        ]
    return splits


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_oxford_flowers_data_files.py",
    doc=__doc__ or "",
    name="oxford_flowers_folder",
    read=read,
    catalog_splits=("train", "test"),
    downloads=(
        "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/102flowers.tgz",
        "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/imagelabels.mat",
        "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/setid.mat",
    ),
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

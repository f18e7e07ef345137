#!/usr/bin/env python3
"""Write Stanford Cars as VISSL's ``stanford_cars_folder`` (196 classes).

Reads the published files (cars_train.tgz, cars_test.tgz, car_devkit.tgz,
cars_test_annos_withlabels.mat) in INPUT::

    INPUT/cars_train/<fname>.jpg, INPUT/cars_test/<fname>.jpg
    INPUT/devkit/cars_meta.mat                "class_names": 1 x 196
    INPUT/devkit/cars_train_annos.mat         "annotations": bbox_x1 ... class, fname
    INPUT/cars_test_annos_withlabels.mat      the same for the test images

and writes ``OUTPUT/{train,test}/<NNN>_<class name>/`` (the class index from 000, spaces
and "/" as "_", so that the sorted folder order is the data set's).

examples:
  python extra_scripts/datasets/create_stanford_cars_data_files.py -i /data/cars -o /data/stanford_cars

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np
import scipy.io

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, ScriptError, require_file, run

ANNOTATIONS = {
    "train": os.path.join("devkit", "cars_train_annos.mat"),
    "test": "cars_test_annos_withlabels.mat",
}


def _load(path: str, key: str) -> Any:
    try:
        return scipy.io.loadmat(require_file(path, f"a .mat file with {key}"))[key]
    except (ValueError, KeyError, OSError) as err:
        raise ScriptError(f"{path} holds no {key!r}: {err}") from err


def _text(value: Any) -> str:
    return str(np.asarray(value).reshape(-1)[0])


def class_folders(root: str) -> list[str]:
    """``NNN_<name>`` of each class of devkit/cars_meta.mat, in the data set's order."""
    names = _load(os.path.join(root, "devkit", "cars_meta.mat"), "class_names").reshape(-1)
    return [f"{i:03d}_" + _text(n).replace(" ", "_").replace("/", "_") for i, n in enumerate(names)]


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    classes = class_folders(args.input)
    splits = {}
    for split, rel in ANNOTATIONS.items():
        path = os.path.join(args.input, rel)
        annotations = _load(path, "annotations").reshape(-1)
        samples = []
        for a in annotations:
            try:
                target = int(np.asarray(a["class"]).reshape(-1)[0])
                name = _text(a["fname"])
            except (ValueError, IndexError) as err:
                raise ScriptError(f"{path}: an annotation has no class/fname: {err}") from err
            if not 1 <= target <= len(classes):
                raise ScriptError(f"{path}: class {target} of {name} is not in 1..{len(classes)}.")
            samples.append(
                Sample(os.path.join(args.input, f"cars_{split}", name), classes[target - 1])
            )
        splits[split] = samples
    return splits


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_stanford_cars_data_files.py",
    doc=__doc__ or "",
    name="stanford_cars_folder",
    read=read,
    catalog_splits=("train", "test"),
    downloads=(
        "https://ai.stanford.edu/~jkrause/car196/cars_train.tgz",
        "https://ai.stanford.edu/~jkrause/car196/cars_test.tgz",
        "https://ai.stanford.edu/~jkrause/cars/car_devkit.tgz",
        "https://ai.stanford.edu/~jkrause/car196/cars_test_annos_withlabels.mat",
    ),
    classes=lambda args: class_folders(args.input),
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

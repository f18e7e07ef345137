#!/usr/bin/env python3
"""Write Caltech-101 as VISSL's ``caltech101_folder``: 30 training images per class (VTAB).

Reads the published archive (101_ObjectCategories.tar.gz) extracted into INPUT::

    INPUT/101_ObjectCategories/<class>/image_0001.jpg

and writes ``OUTPUT/train/<class>/`` (30 images per class, drawn with --seed) and
``OUTPUT/test/<class>/`` (the rest); file names without ``.jpg`` get it. Every folder of
the archive is a class, ``BACKGROUND_Google`` included, as in VISSL.

examples:
  python extra_scripts/datasets/create_caltech101_data_files.py -i /data/caltech101 -o /data/caltech101_vissl

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, ScriptError, files, require_dir, run, subdirs


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    root = require_dir(
        os.path.join(args.input, "101_ObjectCategories"), "one folder of images per class"
    )
    splits: dict[str, list[Sample]] = {"train": [], "test": []}
    rng = random.Random(args.seed)
    for label in subdirs(root):
        names = files(os.path.join(root, label))
        if len(names) <= args.num_train:
            raise ScriptError(
                f"class {label!r} has {len(names)} images, not more than --num_train "
                f"{args.num_train}."
            )
        train = set(rng.sample(range(len(names)), args.num_train))
        for i, name in enumerate(names):
            out_name = name if name.lower().endswith(".jpg") else f"{name}.jpg"
            sample = Sample(os.path.join(root, label, name), label, out_name)
            splits["train" if i in train else "test"].append(sample)
    return splits


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num_train", type=int, default=30, help="training images per class")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draw")


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_caltech101_data_files.py",
    doc=__doc__ or "",
    name="caltech101_folder",
    read=read,
    catalog_splits=("train", "test"),
    downloads=(
        "http://www.vision.caltech.edu/Image_Datasets/Caltech101/101_ObjectCategories.tar.gz",
    ),
    add_arguments=_arguments,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

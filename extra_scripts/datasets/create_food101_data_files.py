#!/usr/bin/env python3
"""Write Food-101 as VISSL's ``food101_folder``.

Reads the published archive (food-101.tar.gz) extracted into INPUT::

    INPUT/food-101/images/<class>/<id>.jpg
    INPUT/food-101/meta/classes.txt                   one class per line
    INPUT/food-101/meta/{train,test}.txt              "<class>/<id>" per line

and writes ``OUTPUT/{train,test}/<class>/<id>.jpg``. (VISSL re-saved the few grayscale
images as RGB; vissl's image sources convert to RGB when they read, so they are copied.)

examples:
  python extra_scripts/datasets/create_food101_data_files.py -i /data/food101_archive -o /data/food101

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import (
    DatasetScript,
    Sample,
    ScriptError,
    read_lines,
    require_dir,
    require_file,
    run,
)


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    root = require_dir(os.path.join(args.input, "food-101"), "images/ and meta/ of Food-101")
    classes = set(read_lines(require_file(os.path.join(root, "meta", "classes.txt"), "classes")))
    splits: dict[str, list[Sample]] = {}
    for split in ("train", "test"):
        path = require_file(os.path.join(root, "meta", f"{split}.txt"), f"the {split} list")
        samples = []
        for line in read_lines(path):
            label, _, image_id = line.partition("/")
            if label not in classes:
                raise ScriptError(f"{path}: class {label!r} is not in meta/classes.txt.")
            samples.append(Sample(os.path.join(root, "images", label, f"{image_id}.jpg"), label))
        splits[split] = samples
    return splits


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_food101_data_files.py",
    doc=__doc__ or "",
    name="food101_folder",
    read=read,
    catalog_splits=("train", "test"),
    downloads=("http://data.vision.ee.ethz.ch/cvl/food-101.tar.gz",),
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

#!/usr/bin/env python3
"""Write the German Traffic Sign Recognition Benchmark as VISSL's ``gtsrb_folder``.

Reads the published archives (GTSRB-Training_fixed.zip, GTSRB_Final_Test_Images.zip,
GTSRB_Final_Test_GT.zip) extracted into INPUT::

    INPUT/GTSRB/Training/<class 00000..00042>/<image>.ppm
    INPUT/GTSRB/Final_Test/Images/<image>.ppm
    INPUT/GT-final_test.csv           "Filename;Width;Height;...;ClassId", a header line

and writes ``OUTPUT/train/<class>/`` (the training folders' images) and
``OUTPUT/test/<class>/`` (the test images, class from the CSV, as ``%05d``).

examples:
  python extra_scripts/datasets/create_gtsrb_data_files.py -i /data/gtsrb_archives -o /data/gtsrb

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import (
    DatasetScript,
    Sample,
    ScriptError,
    class_folder_samples,
    require_dir,
    require_file,
    run,
)

IMAGE_EXTENSIONS = (".ppm", ".png", ".jpg")


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    train = require_dir(os.path.join(args.input, "GTSRB", "Training"), "the training classes")
    test = require_dir(os.path.join(args.input, "GTSRB", "Final_Test", "Images"), "the test images")
    gt = require_file(os.path.join(args.input, "GT-final_test.csv"), "the test labels")
    test_samples = []
    with open(gt, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter=";"))
    for number, row in enumerate(rows[1:], start=2):
        try:
            label = int(row[-1])
        except (IndexError, ValueError) as err:
            raise ScriptError(f"{gt}:{number}: no integer ClassId in {row!r}.") from err
        test_samples.append(Sample(os.path.join(test, row[0]), f"{label:05d}"))
    return {"train": class_folder_samples(train, IMAGE_EXTENSIONS), "test": test_samples}


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_gtsrb_data_files.py",
    doc=__doc__ or "",
    name="gtsrb_folder",
    read=read,
    catalog_splits=("train", "test"),
    downloads=(
        "https://sid.erda.dk/public/archives/daaeac0d7ce1152aea9b61d9f1e19370/GTSRB-Training_fixed.zip",
        "https://sid.erda.dk/public/archives/daaeac0d7ce1152aea9b61d9f1e19370/GTSRB_Final_Test_Images.zip",
        "https://sid.erda.dk/public/archives/daaeac0d7ce1152aea9b61d9f1e19370/GTSRB_Final_Test_GT.zip",
    ),
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

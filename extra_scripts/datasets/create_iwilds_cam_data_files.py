#!/usr/bin/env python3
"""Write iWildCam 2020 (WILDS) as VISSL's ``iwilds_cam_*_filelist`` files.

Reads the published WILDS archive (iwildcam_v2.0) extracted into INPUT::

    INPUT/metadata.csv      columns include split, filename and y
    INPUT/train/<filename>

and writes ``OUTPUT/<split>_images.npy`` / ``_labels.npy`` for every split of the CSV
(train, val, test, id_val, id_test), labels the ``y`` column. The four catalog names share
the train split: ``iwilds_cam_val_filelist`` tests on val, ``iwilds_cam_id_val_filelist``
on id_val, ``iwilds_cam_test_filelist`` on test, ``iwilds_cam_id_test_filelist`` on
id_test; the entry printed is the one of --val_split.

examples:
  python extra_scripts/datasets/create_iwilds_cam_data_files.py -i /data/iwildcam_v2.0 -o /data/iwildcam

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
    require_file,
    run,
)

#: Catalog name of each test split.
CATALOG_NAMES = {
    "val": "iwilds_cam_val_filelist",
    "id_val": "iwilds_cam_id_val_filelist",
    "test": "iwilds_cam_test_filelist",
    "id_test": "iwilds_cam_id_test_filelist",
}


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    path = require_file(os.path.join(args.input, "metadata.csv"), "the WILDS metadata")
    splits: dict[str, list[Sample]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = {"split", "filename", "y"} - set(reader.fieldnames or ())
        if missing:
            raise ScriptError(f"{path} has no column(s) {sorted(missing)}.")
        for row in reader:
            sample = Sample(os.path.join(args.input, "train", row["filename"]), int(row["y"]))
            splits.setdefault(row["split"], []).append(sample)
    return dict(sorted(splits.items()))


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--val_split",
        choices=sorted(CATALOG_NAMES),
        default="val",
        help="the split of the printed catalog entry's val (and its default --name)",
    )


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_iwilds_cam_data_files.py",
    doc=__doc__ or "",
    name="iwilds_cam_val_filelist",
    read=read,
    fmt="filelist",
    formats=("filelist",),
    downloads=(
        "https://worksheets.codalab.org/rest/bundles/0x6313da2b204647e79a14b468131fcd64/contents/blob/",
    ),
    add_arguments=_arguments,
    catalog=lambda args: (CATALOG_NAMES[args.val_split], "train", args.val_split),
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

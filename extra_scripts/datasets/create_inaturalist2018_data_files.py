#!/usr/bin/env python3
"""Write iNaturalist 2018 as VISSL's ``inaturalist2018_filelist``.

Reads the published archives (train_val2018.tar.gz, train2018.json.tar.gz,
val2018.json.tar.gz) extracted into INPUT::

    INPUT/train2018.json, INPUT/val2018.json    "images": [{"file_name":
                                                 "train_val2018/<kingdom>/<category id>/<x>.jpg"}]
    INPUT/train_val2018/<kingdom>/<category id>/<x>.jpg

and writes ``OUTPUT/{train,val}_images.npy`` / ``_labels.npy``; an image's label is the
category id in its path (0 to 8141), as VISSL.

examples:
  python extra_scripts/datasets/create_inaturalist2018_data_files.py -i /data/inat2018 -o /data/inat2018_filelists

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, ScriptError, require_file, run


def read_split(root: str, split: str) -> list[Sample]:
    path = require_file(os.path.join(root, f"{split}2018.json"), f"the {split} annotations")
    try:
        with open(path, encoding="utf-8") as f:
            names = [im["file_name"] for im in json.load(f)["images"]]
    except (ValueError, KeyError, TypeError) as err:
        raise ScriptError(f"{path} is not an iNaturalist annotation file: {err}") from err
    samples = []
    for name in names:
        parts = name.split("/")
        if len(parts) < 4 or not parts[2].isdigit():
            raise ScriptError(f"{path}: {name!r} is not <folder>/<kingdom>/<id>/<file>.")
        samples.append(Sample(os.path.join(root, "train_val2018", *parts[1:]), int(parts[2])))
    return samples


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    return {split: read_split(args.input, split) for split in ("train", "val")}


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_inaturalist2018_data_files.py",
    doc=__doc__ or "",
    name="inaturalist2018_filelist",
    read=read,
    fmt="filelist",
    formats=("filelist",),
    downloads=(
        "https://ml-inat-competition-datasets.s3.amazonaws.com/2018/train_val2018.tar.gz",
        "https://ml-inat-competition-datasets.s3.amazonaws.com/2018/train2018.json.tar.gz",
        "https://ml-inat-competition-datasets.s3.amazonaws.com/2018/val2018.json.tar.gz",
    ),
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

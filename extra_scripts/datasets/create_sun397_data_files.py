#!/usr/bin/env python3
"""Write SUN397 as VISSL's ``sun397_filelist``: 70% train, 10% val, 20% test per class.

Reads the published archive (SUN397.tar.gz) extracted into INPUT::

    INPUT/SUN397/ClassName.txt          "/a/abbey" per line: the 397 classes, in order
    INPUT/SUN397/a/abbey/sun_<id>.jpg

and writes ``OUTPUT/{train,val,test,trainval}_images.npy`` / ``_labels.npy``: each class's
images, shuffled with --seed, cut 70 / 10 / 20 (trainval is train and val); the label is
the class's line number in ClassName.txt.

examples:
  python extra_scripts/datasets/create_sun397_data_files.py -i /data/sun397 -o /data/sun397_filelists

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
    files,
    random_split,
    read_lines,
    require_dir,
    require_file,
    run,
)

FRACTIONS = {"train": 0.7, "val": 0.1, "test": 1.0}


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    root = require_dir(os.path.join(args.input, "SUN397"), "SUN397's class folders")
    classes = read_lines(require_file(os.path.join(root, "ClassName.txt"), "the class list"))
    splits: dict[str, list[Sample]] = {"train": [], "val": [], "test": []}
    for label, name in enumerate(classes):
        folder = require_dir(os.path.join(root, name.lstrip("/")), f"the images of {name}")
        parts = random_split(files(folder), FRACTIONS, args.seed + label)
        for split, chosen in parts.items():
            splits[split] += [Sample(os.path.join(folder, n), label) for n in chosen]
    splits["trainval"] = splits["train"] + splits["val"]
    return splits


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, help="seed of the split")


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_sun397_data_files.py",
    doc=__doc__ or "",
    name="sun397_filelist",
    read=read,
    fmt="filelist",
    formats=("filelist",),
    downloads=("http://vision.princeton.edu/projects/2010/SUN/SUN397.tar.gz",),
    add_arguments=_arguments,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

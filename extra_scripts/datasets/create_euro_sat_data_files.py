#!/usr/bin/env python3
"""Write EuroSAT (RGB) as VISSL's ``euro_sat_folder``: 1000 train and 500 val images per class.

Reads the published archive (EuroSAT.zip) extracted into INPUT::

    INPUT/2750/<class>/<class>_<n>.jpg        (or INPUT/EuroSAT_RGB/<class>/...)

and writes ``OUTPUT/train/<class>/`` (each class's first --train_per_class files, sorted by
name) and ``OUTPUT/val/<class>/`` (the next --val_per_class), as VISSL.

examples:
  python extra_scripts/datasets/create_euro_sat_data_files.py -i /data/eurosat -o /data/euro_sat

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, ScriptError, files, run, subdirs

IMAGE_FOLDERS = ("2750", "EuroSAT_RGB", os.path.join("EuroSAT", "2750"))


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    roots = [os.path.join(args.input, f) for f in IMAGE_FOLDERS]
    root = next((r for r in roots if os.path.isdir(r)), None)
    if root is None:
        raise ScriptError(f"none of {roots} exists: extract EuroSAT.zip into {args.input}.")
    splits: dict[str, list[Sample]] = {"train": [], "val": []}
    end = args.train_per_class + args.val_per_class
    for label in subdirs(root):
        names = files(os.path.join(root, label))
        for i, name in enumerate(names[:end]):
            split = "train" if i < args.train_per_class else "val"
            splits[split].append(Sample(os.path.join(root, label, name), label))
    return splits


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train_per_class", type=int, default=1000, help="train images")
    parser.add_argument("--val_per_class", type=int, default=500, help="val images")


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_euro_sat_data_files.py",
    doc=__doc__ or "",
    name="euro_sat_folder",
    read=read,
    downloads=("http://madm.dfki.de/files/sentinel/EuroSAT.zip",),
    add_arguments=_arguments,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

#!/usr/bin/env python3
"""Write NWPU-RESISC45 as a ``disk_folder``: 80% train, 20% test per class (VTAB).

Reads the published archive (NWPU-RESISC45.rar) extracted into INPUT::

    INPUT/<class>/<class>_<n>.jpg          (or INPUT/NWPU-RESISC45/<class>/...)

and writes ``OUTPUT/train/<class>/`` and ``OUTPUT/test/<class>/``: each class's files,
shuffled with --seed, 80% to train and 20% to test (as VISSL, which has no catalog entry
for it: ``--name`` defaults to resisc45_folder).

examples:
  python extra_scripts/datasets/create_resisc45_data_files.py -i /data/NWPU-RESISC45 -o /data/resisc45

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, files, random_split, run, subdirs


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    root = args.input
    if os.path.isdir(os.path.join(root, "NWPU-RESISC45")):
        root = os.path.join(root, "NWPU-RESISC45")
    splits: dict[str, list[Sample]] = {"train": [], "test": []}
    for label in subdirs(root):
        names = files(os.path.join(root, label))
        parts = random_split(names, {"train": 0.8, "test": 1.0}, args.seed)
        for split, chosen in parts.items():
            splits[split] += [Sample(os.path.join(root, label, n), label) for n in chosen]
    return splits


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=42, help="seed of the split")


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_resisc45_data_files.py",
    doc=__doc__ or "",
    name="resisc45_folder",
    read=read,
    catalog_splits=("train", "test"),
    add_arguments=_arguments,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

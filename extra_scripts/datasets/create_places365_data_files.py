#!/usr/bin/env python3
"""Write Places365-Standard as VISSL's ``places365_folder`` (or ``--format filelist``).

Reads the published archives (places365standard: train_256_places365standard.tar,
val_256.tar, filelist_places365-standard.tar) extracted into INPUT::

    INPUT/data_256/a/airfield/00000001.jpg
    INPUT/val_256/Places365_val_00000001.jpg
    INPUT/categories_places365.txt          "/a/airfield 0"
    INPUT/places365_train_standard.txt      "/a/airfield/00000001.jpg 0"
    INPUT/places365_val.txt                 "Places365_val_00000001.jpg 0"

(the list files may also be in INPUT/filelist_places365-standard/) and writes
``OUTPUT/{train,val}/<NNN>_<category>/`` (NNN the label, so that the sorted folder order is
the data set's). Use ``--link symlink`` to leave the 1.8M images where they are.

examples:
  python extra_scripts/datasets/create_places365_data_files.py -i /data/places365 -o /data/places365_vissl --link symlink

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, ScriptError, run
from _places import class_folder, read_list, to_samples

SPLITS = {
    "train": ("places365_train_standard.txt", "data_256"),
    "val": ("places365_val.txt", "val_256"),
}


def _list(args: argparse.Namespace, name: str) -> str:
    for folder in (args.input, os.path.join(args.input, "filelist_places365-standard")):
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    raise ScriptError(f"{name} is neither in {args.input} nor in its filelist_places365-standard/.")


def categories(args: argparse.Namespace) -> list[str]:
    names = dict(
        (label, path) for path, label in read_list(_list(args, "categories_places365.txt"), "/")
    )
    if sorted(names) != list(range(len(names))):
        raise ScriptError("categories_places365.txt's labels are not 0..N-1.")
    return [class_folder(i, names[i]) for i in range(len(names))]


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    classes = categories(args)
    splits = {}
    for split, (name, folder) in SPLITS.items():
        path = _list(args, name)
        splits[split] = to_samples(read_list(path, os.path.join(args.input, folder)), classes, path)
    return splits


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_places365_data_files.py",
    doc=__doc__ or "",
    name="places365_folder",
    read=read,
    classes=categories,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

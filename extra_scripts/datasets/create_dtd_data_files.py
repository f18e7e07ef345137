#!/usr/bin/env python3
"""Write the Describable Textures Dataset as VISSL's ``dtd_folder``.

Reads the published archive (dtd-r1.0.1.tar.gz) extracted into INPUT::

    INPUT/dtd/images/<class>/<image>.jpg
    INPUT/dtd/labels/{train,val,test}<fold>.txt     "<class>/<image>.jpg" per line

and writes ``OUTPUT/{train,val,test,trainval}/<class>/`` from the files of ``--fold``
(default 1, as VISSL); trainval is train and val together.

examples:
  python extra_scripts/datasets/create_dtd_data_files.py -i /data/dtd_archive -o /data/dtd

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, read_lines, require_dir, require_file, run


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    root = require_dir(os.path.join(args.input, "dtd"), "images/ and labels/ of DTD")
    splits: dict[str, list[Sample]] = {}
    for split in ("train", "val", "test"):
        path = require_file(
            os.path.join(root, "labels", f"{split}{args.fold}.txt"), f"the {split} list"
        )
        splits[split] = [
            Sample(os.path.join(root, "images", line), line.split("/")[0])
            for line in read_lines(path)
        ]
    splits["trainval"] = splits["train"] + splits["val"]
    return splits


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fold", type=int, default=1, help="DTD's split number, 1 to 10")


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_dtd_data_files.py",
    doc=__doc__ or "",
    name="dtd_folder",
    read=read,
    catalog_splits=("trainval", "test"),
    downloads=("https://www.robots.ox.ac.uk/~vgg/data/dtd/download/dtd-r1.0.1.tar.gz",),
    add_arguments=_arguments,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

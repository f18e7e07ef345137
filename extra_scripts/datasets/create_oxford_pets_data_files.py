#!/usr/bin/env python3
"""Write the Oxford-IIIT Pets as VISSL's ``oxford_pets_folder`` (37 breeds).

Reads the published archives (images.tar.gz, annotations.tar.gz) extracted into INPUT::

    INPUT/images/<Breed_Name>_<n>.jpg
    INPUT/annotations/{trainval,test}.txt      "<Breed_Name>_<n> <class> <species> <breed>"

and writes ``OUTPUT/{train,test}/<Breed_Name>/`` from trainval and test; the class is the
image name without its number.

examples:
  python extra_scripts/datasets/create_oxford_pets_data_files.py -i /data/pets -o /data/oxford_pets

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, read_lines, require_file, run

SPLITS = {"train": "trainval", "test": "test"}


def breed(image_name: str) -> str:
    """``Great_Pyrenees_12`` -> ``Great_Pyrenees``."""
    return image_name.rsplit("_", 1)[0]


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    splits = {}
    for split, listing in SPLITS.items():
        path = require_file(os.path.join(args.input, "annotations", f"{listing}.txt"), listing)
        names = [line.split()[0] for line in read_lines(path) if not line.startswith("#")]
        splits[split] = [
            Sample(os.path.join(args.input, "images", f"{n}.jpg"), breed(n)) for n in names
        ]
    return splits


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_oxford_pets_data_files.py",
    doc=__doc__ or "",
    name="oxford_pets_folder",
    read=read,
    catalog_splits=("train", "test"),
    downloads=(
        "https://www.robots.ox.ac.uk/~vgg/data/pets/data/images.tar.gz",
        "https://www.robots.ox.ac.uk/~vgg/data/pets/data/annotations.tar.gz",
    ),
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

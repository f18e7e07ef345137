#!/usr/bin/env python3
"""Write FGVC-Aircraft (variants) as VISSL's ``aircrafts_folder``.

Reads the published archive (fgvc-aircraft-2013b.tar.gz) extracted into INPUT::

    INPUT/fgvc-aircraft-2013b/data/images/<id>.jpg
    INPUT/fgvc-aircraft-2013b/data/variants.txt                      one variant per line
    INPUT/fgvc-aircraft-2013b/data/images_variant_{trainval,train,val,test}.txt
                                                                     "<id> <variant>" per line

and writes ``OUTPUT/{trainval,train,val,test}/<variant>/<id>.jpg``; a variant's folder
name has "/" and " " replaced by "-" (``F-16A/B`` -> ``F-16A-B``). With ``--format
filelist`` the labels index the sorted folder names of all 100 variants.

examples:
  python extra_scripts/datasets/create_fgvc_aircraft_data_files.py -i /data/aircraft -o /data/aircrafts

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

SPLITS = ("trainval", "train", "val", "test")


def folder_name(variant: str) -> str:
    """The class folder of a variant name."""
    return variant.replace("/", "-").replace(" ", "-")


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    data = require_dir(
        os.path.join(args.input, "fgvc-aircraft-2013b", "data"), "FGVC-Aircraft's data folder"
    )
    variants = {
        folder_name(v)
        for v in read_lines(
            require_file(os.path.join(data, "variants.txt"), "the list of variants")
        )
    }
    splits: dict[str, list[Sample]] = {}
    for split in SPLITS:
        path = require_file(os.path.join(data, f"images_variant_{split}.txt"), f"the {split} list")
        samples = []
        for line in read_lines(path):
            image_id, _, variant = line.partition(" ")
            label = folder_name(variant)
            if label not in variants:
                raise ScriptError(f"{path}: variant {variant!r} is not in variants.txt.")
            samples.append(Sample(os.path.join(data, "images", f"{image_id}.jpg"), label))
        splits[split] = samples
    return splits


def classes(args: argparse.Namespace) -> list[str]:
    path = os.path.join(args.input, "fgvc-aircraft-2013b", "data", "variants.txt")
    return sorted({folder_name(v) for v in read_lines(path)})


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_fgvc_aircraft_data_files.py",
    doc=__doc__ or "",
    name="aircrafts_folder",
    read=read,
    catalog_splits=("trainval", "test"),
    downloads=(
        "https://www.robots.ox.ac.uk/~vgg/data/fgvc-aircraft/archives/fgvc-aircraft-2013b.tar.gz",
    ),
    classes=classes,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

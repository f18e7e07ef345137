#!/usr/bin/env python3
"""Write Places205 as VISSL's ``places205_folder`` (or ``--format filelist``).

Reads the published archives (imagesPlaces205_resize.tar.gz, trainvalsplit_places205.tar.gz)
extracted into INPUT::

    INPUT/data/vision/torralba/deeplearning/images256/a/abbey/<image>.jpg
                                        (or INPUT/images256/..., or --images_dir)
    INPUT/trainvalsplit_places205/{train,val}_places205.csv    "a/abbey/<image>.jpg 0"

and writes ``OUTPUT/{train,val}/<NNN>_<category>/`` (NNN the label, so that the sorted
folder order is the data set's). Use ``--link symlink`` to leave the 2.5M images where
they are.

examples:
  python extra_scripts/datasets/create_places205_data_files.py -i /data/places205 -o /data/places205_vissl --link symlink

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, ScriptError, run
from _places import class_folder, read_list, to_samples

IMAGE_DIRS = (os.path.join("data", "vision", "torralba", "deeplearning", "images256"), "images256")


def _image_dir(args: argparse.Namespace) -> str:
    if args.images_dir:
        return args.images_dir
    for rel in IMAGE_DIRS:
        if os.path.isdir(os.path.join(args.input, rel)):
            return os.path.join(args.input, rel)
    raise ScriptError(f"no images256 folder under {args.input}: give --images_dir.")


def _lists(args: argparse.Namespace) -> dict[str, str]:
    folder = os.path.join(args.input, "trainvalsplit_places205")
    return {split: os.path.join(folder, f"{split}_places205.csv") for split in ("train", "val")}


def categories(args: argparse.Namespace) -> list[str]:
    """The class folders, from the train list: label -> the image's category path."""
    names: dict[int, str] = {}
    for image, label in read_list(_lists(args)["train"], ""):
        names.setdefault(label, "/".join(image.split("/")[:-1]))
    if sorted(names) != list(range(len(names))):
        raise ScriptError("the train list's labels are not 0..N-1.")
    return [class_folder(i, names[i]) for i in range(len(names))]


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    images, classes = _image_dir(args), categories(args)
    return {
        split: to_samples(read_list(path, images), classes, path)
        for split, path in _lists(args).items()
    }


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--images_dir", default=None, help="the images256 folder")


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_places205_data_files.py",
    doc=__doc__ or "",
    name="places205_folder",
    read=read,
    add_arguments=_arguments,
    classes=categories,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

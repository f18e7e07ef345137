#!/usr/bin/env python3
"""Write an ImageNet-1k subset (SimCLR's 1% / 10% lists) as ``disk_filelist`` files
(VISSL's ``google-imagenet1k-per01`` / ``google-imagenet1k-per10``).

Reads the subset list, one training image name per line as published with SimCLR
(``n01440764_10026.JPEG``; the class is the part before ``_``), and ImageNet's class
folders::

    SUBSET_FILE                           e.g. 1percent.txt, 10percent.txt
    INPUT/train/<wnid>/<image>.JPEG

and writes ``OUTPUT/train_images.npy`` / ``train_labels.npy``: the listed images, labels
the index of their class among the sorted class folders of INPUT/train (ImageNet's 1000
labels). Use ImageNet's val files (create_imagenet_data_files.py) to test. VISSL's own
``imagenet1k-per01`` / ``-per10`` were published as .npy files already: they need no
script.

examples:
  python extra_scripts/datasets/create_imagenet_subset_data_files.py -i /data/imagenet \\
      -o /data/imagenet_per01 --subset_file 1percent.txt --name google-imagenet1k-per01

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
    subdirs,
)


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    train = require_dir(os.path.join(args.input, "train"), "ImageNet's train class folders")
    index = {c: i for i, c in enumerate(subdirs(train))}
    samples = []
    for name in read_lines(require_file(args.subset_file, "the subset list")):
        wnid = name.split("_")[0]
        if wnid not in index:
            raise ScriptError(f"{args.subset_file}: {name!r} names no class folder of {train}.")
        samples.append(Sample(os.path.join(train, wnid, name), index[wnid]))
    return {"train": samples}


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--subset_file", required=True, help="the list of image names")


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_imagenet_subset_data_files.py",
    doc=__doc__ or "",
    name="google-imagenet1k-per01",
    read=read,
    fmt="filelist",
    formats=("filelist",),
    catalog_splits=("train", None),
    add_arguments=_arguments,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

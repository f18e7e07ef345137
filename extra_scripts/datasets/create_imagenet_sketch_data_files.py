#!/usr/bin/env python3
"""Write ImageNet-Sketch as a test split with ImageNet-1k's labels (VISSL's ``imagenet_sketch_filelist``).

Reads the published archive (ImageNet-Sketch.zip) extracted into INPUT::

    INPUT/imagenet_sketch/<wnid>/<image>

and writes ``OUTPUT/test_images.npy`` and ``OUTPUT/test_labels.npy``: each image's label is
the index of its class among ImageNet-1k's 1000 sorted WordNet ids (--imagenet_classes), so
a model trained on ImageNet-1k is tested as it is. (VISSL renamed the files with spaces in
their names; vissl reads such paths as they are.)

examples:
  python extra_scripts/datasets/create_imagenet_sketch_data_files.py -i /data -o /data/imagenet_sketch \\
      --imagenet_classes /data/imagenet/train

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, require_dir, run
from _imagenet import add_classes_argument, imagenet_classes, imagenet_labelled


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    folder = require_dir(os.path.join(args.input, "imagenet_sketch"), "one folder per WordNet id")
    return {"test": imagenet_labelled(folder, imagenet_classes(args.imagenet_classes))}


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_imagenet_sketch_data_files.py",
    doc=__doc__ or "",
    name="imagenet_sketch_filelist",
    read=read,
    fmt="filelist",
    formats=("filelist",),
    catalog_splits=(None, "test"),
    downloads=(),
    add_arguments=add_classes_argument,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

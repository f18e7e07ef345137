#!/usr/bin/env python3
"""Write KITTI closest-vehicle distance (VTAB) as VISSL's ``kitti_dist_folder``.

Reads the published object-detection archives (data_object_image_2.zip,
data_object_label_2.zip) extracted into INPUT::

    INPUT/training/image_2/<id>.png
    INPUT/training/label_2/<id>.txt     one object per line: type ... (field 14: z, metres)

and writes ``OUTPUT/{train,val}/<bin>/<id>.png``: the class is the distance of the closest
Car, Van or Truck: ``no_vehicle``, ``below_8``, ``below_20`` or ``above_20``; 80% of the
images, drawn with --seed, go to train (KITTI's test images have no labels).

examples:
  python extra_scripts/datasets/create_kitti_dist_data_files.py -i /data/kitti -o /data/kitti_dist

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import (
    DatasetScript,
    Sample,
    ScriptError,
    files,
    random_split,
    require_dir,
    run,
)

VEHICLES = {"Car", "Van", "Truck"}
THRESHOLDS = (0.0, 8.0, 20.0)
LABELS = ("no_vehicle", "below_8", "below_20", "above_20")


def closest_vehicle(path: str) -> float:
    """The smallest z (field 14) of the vehicles of a label file; -inf without vehicles."""
    distances = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            fields = line.split()
            if not fields or fields[0] not in VEHICLES:
                continue
            try:
                distances.append(float(fields[13]))
            except (IndexError, ValueError) as err:
                raise ScriptError(f"{path}:{number}: not a KITTI object line.") from err
    return min(distances, default=-math.inf)


def distance_label(distance: float) -> str:
    return LABELS[bisect.bisect_left(THRESHOLDS, distance)]


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    images = require_dir(os.path.join(args.input, "training", "image_2"), "the images")
    labels = require_dir(os.path.join(args.input, "training", "label_2"), "the labels")
    samples = []
    for name in files(images, (".png",)):
        label_file = os.path.join(labels, os.path.splitext(name)[0] + ".txt")
        if not os.path.isfile(label_file):
            raise ScriptError(f"{label_file} is missing (the objects of {name}).")
        samples.append(
            Sample(os.path.join(images, name), distance_label(closest_vehicle(label_file)))
        )
    parts = random_split(samples, {"train": args.train_fraction, "val": 1.0}, args.seed)
    return parts


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train_fraction", type=float, default=0.8, help="share of train")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split")


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_kitti_dist_data_files.py",
    doc=__doc__ or "",
    name="kitti_dist_folder",
    read=read,
    downloads=(
        "https://s3.eu-central-1.amazonaws.com/avg-kitti/data_object_image_2.zip",
        "https://s3.eu-central-1.amazonaws.com/avg-kitti/data_object_label_2.zip",
    ),
    add_arguments=_arguments,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

#!/usr/bin/env python3
"""Write dSprites location (VTAB) as VISSL's ``dsprites_loc_folder``.

Reads the published repository archive (dsprites-dataset master.zip) extracted into INPUT::

    INPUT/dsprites-dataset-master/dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz

and writes its images as PNG into ``OUTPUT/{train,val}/bin_<k>/image_<i>.png``: the class is
the x position of the sprite (32 values) in 16 bins; 80% of the images, drawn with --seed, go to train.

examples:
  python extra_scripts/datasets/create_dsprites_location_data_files.py -i /data/dsprites -o /data/dsprites_loc

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, run
from _dsprites import location_bin, read_dsprites


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    return read_dsprites(args.input, location_bin, args.train_fraction, args.seed)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train_fraction", type=float, default=0.8, help="share of train")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split")


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_dsprites_location_data_files.py",
    doc=__doc__ or "",
    name="dsprites_loc_folder",
    read=read,
    downloads=("https://github.com/deepmind/dsprites-dataset/archive/master.zip",),
    add_arguments=_arguments,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

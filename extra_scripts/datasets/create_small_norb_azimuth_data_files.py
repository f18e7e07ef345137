#!/usr/bin/env python3
"""Write smallNORB azimuth (VTAB) as VISSL's ``small_norb_azimuth_folder``.

Reads the published files (gunzipped) in INPUT::

    INPUT/smallnorb-5x46789x9x18x6x2x96x96-training-{dat,info}.mat
    INPUT/smallnorb-5x01235x9x18x6x2x96x96-testing-{dat,info}.mat

(NORB's binary matrix format, not MATLAB's) and writes the first image of each stereo
pair into ``OUTPUT/{train,test}/<class>/image_<i>.png``; the class is the azimuth in degrees (0, 20, ..., 340).

examples:
  python extra_scripts/datasets/create_small_norb_azimuth_data_files.py -i /data/small_norb -o /data/small_norb_azimuth

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, run
from _small_norb import azimuth, read_small_norb


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    return read_small_norb(args.input, azimuth)


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_small_norb_azimuth_data_files.py",
    doc=__doc__ or "",
    name="small_norb_azimuth_folder",
    read=read,
    catalog_splits=("train", "test"),
    downloads=("https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/",),
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

#!/usr/bin/env python3
"""Write CLEVR object counting (VTAB) as VISSL's ``clevr_count_filelist``.

Reads the published archive (CLEVR_v1.0.zip) extracted into INPUT::

    INPUT/CLEVR_v1.0/images/{train,val}/CLEVR_<split>_000000.png
    INPUT/CLEVR_v1.0/scenes/CLEVR_{train,val}_scenes.json

and writes ``OUTPUT/{train,val}_images.npy`` / ``_labels.npy`` and ``classes.json``. The
target is the number of objects in the scene: labels count_3 ... count_10; val keeps only
the counts train has, as in VISSL.

examples:
  python extra_scripts/datasets/create_clevr_count_data_files.py -i /data/clevr -o /data/clevr_count

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _clevr import count_label, read_clevr
from _dataset_files import DatasetScript, Sample, run


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    return read_clevr(args.input, count_label, keep_train_classes=True)


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_clevr_count_data_files.py",
    doc=__doc__ or "",
    name="clevr_count_filelist",
    read=read,
    fmt="filelist",
    downloads=("https://dl.fbaipublicfiles.com/clevr/CLEVR_v1.0.zip",),
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

#!/usr/bin/env python3
"""Write UCF101's middle frames as VISSL's ``ucf101_folder`` (split 1 by default).

Reads the published archives (UCF101.rar, UCF101TrainTestSplits-RecognitionTask.zip)
extracted into INPUT::

    INPUT/UCF-101/<Class>/v_<Class>_g01_c01.avi
    INPUT/ucfTrainTestlist/trainlist0<k>.txt      "<Class>/<video>.avi <label>" per line
    INPUT/ucfTrainTestlist/testlist0<k>.txt       "<Class>/<video>.avi" per line

and writes the middle frame of each listed clip as ``OUTPUT/{train,val}/<Class>/<video>.jpg``
(train from trainlist, val from testlist of ``--split_number``). Decoding needs PyAV
(``pip install av``).

examples:
  python extra_scripts/datasets/create_ucf101_data_files.py -i /data/ucf101 -o /data/ucf101_frames

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, read_lines, require_dir, require_file, run
from _video import frame_of

LISTS = {"train": "trainlist", "val": "testlist"}


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    videos = require_dir(os.path.join(args.input, "UCF-101"), "one folder of clips per class")
    lists = require_dir(os.path.join(args.input, "ucfTrainTestlist"), "the split lists")
    splits = {}
    for split, stem in LISTS.items():
        path = require_file(os.path.join(lists, f"{stem}0{args.split_number}.txt"), stem)
        samples = []
        for line in read_lines(path):
            relative = line.split()[0]
            label, video = relative.split("/")[0], os.path.basename(relative)
            source = os.path.join(videos, label, video)
            require_file(source, f"the clip listed in {path}")
            samples.append(Sample(frame_of(source), label, os.path.splitext(video)[0] + ".jpg"))
        splits[split] = samples
    return splits


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split_number", type=int, default=1, choices=(1, 2, 3))


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_ucf101_data_files.py",
    doc=__doc__ or "",
    name="ucf101_folder",
    read=read,
    downloads=(
        "https://www.crcv.ucf.edu/data/UCF101/UCF101.rar",
        "https://www.crcv.ucf.edu/data/UCF101/UCF101TrainTestSplits-RecognitionTask.zip",
    ),
    add_arguments=_arguments,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

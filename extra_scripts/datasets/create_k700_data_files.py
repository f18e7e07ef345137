#!/usr/bin/env python3
"""Write Kinetics-700 (2020) middle frames as VISSL's ``kinetics700_frames_folder``.

Reads the published clips, extracted per split into INPUT::

    INPUT/{train,val}/<label>/<youtube id>_<start>_<end>.mp4

and writes the middle frame of each clip as ``OUTPUT/{train,val}/<label>/<clip>.jpg``
(CLIP's protocol; labels lose their parentheses and have "_" for spaces). A clip without
a video stream is left out and named in ``OUTPUT/<split>_errors.txt``. Decoding needs
PyAV (``pip install av``).

examples:
  python extra_scripts/datasets/create_k700_data_files.py -i /data/k700 -o /data/k700_frames

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, files, require_dir, run, subdirs
from _video import frame_of

VIDEO_EXTENSIONS = (".mp4", ".webm", ".mkv", ".avi")


def clean_label(label: str) -> str:
    """``"passing American football (in game)"`` -> ``"passing_American_football_in_game"``."""
    return label.replace("(", "").replace(")", "").replace(" ", "_").strip("_")


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    splits: dict[str, list[Sample]] = {}
    for split in ("train", "val"):
        root = require_dir(os.path.join(args.input, split), f"the {split} clips per label")
        samples = []
        for label in subdirs(root):
            for name in files(os.path.join(root, label), VIDEO_EXTENSIONS):
                path = os.path.join(root, label, name)
                image_name = os.path.splitext(name)[0] + ".jpg"
                samples.append(Sample(frame_of(path), clean_label(label), image_name))
        splits[split] = samples
    return splits


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_k700_data_files.py",
    doc=__doc__ or "",
    name="kinetics700_frames_folder",
    read=read,
    downloads=("https://s3.amazonaws.com/kinetics/700_2020/",),
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

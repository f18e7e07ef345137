#!/usr/bin/env python3
"""Write ImageNet-1k (or any ``train``/``val`` class-folder data set: Places205, Imagenette)
as ``disk_filelist`` files (VISSL's ``imagenet1k_filelist``).

Reads the class folders::

    INPUT/train/<wnid>/<image>.JPEG
    INPUT/val/<wnid>/<image>.JPEG

(ImageNet's validation archive is flat: sort it into class folders first, e.g. with the
devkit's ground truth) and writes ``OUTPUT/{train,val}_images.npy`` / ``_labels.npy``,
labels the index of the class folder among the sorted folder names of both splits (the
labels ``disk_folder`` gives), and ``classes.json``. ``--generate_json 1`` also writes
``OUTPUT/<split>_targets.json``: ``{"<wnid>/<image>": label}``. The folders themselves
are VISSL's ``imagenet1k_folder`` as they are.

examples:
  python extra_scripts/datasets/create_imagenet_data_files.py \\
      --data_source_dir /data/imagenet --output_dir /data/imagenet_filelists

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import (
    DatasetScript,
    Sample,
    class_folder_samples,
    require_dir,
    run,
    subdirs,
)

SPLITS = ("train", "val")


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    return {
        split: class_folder_samples(
            require_dir(os.path.join(args.input, split), f"the {split} class folders")
        )
        for split in SPLITS
    }


def classes(args: argparse.Namespace) -> list[str]:
    return sorted({c for split in SPLITS for c in subdirs(os.path.join(args.input, split))})


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--generate_json", type=int, default=0, help="1: also write <split>_targets.json"
    )


def write_targets(args: argparse.Namespace, splits: Mapping[str, Sequence[Sample]]) -> None:
    """``--generate_json 1``: ``OUTPUT/<split>_targets.json``, ``{"<wnid>/<image>": label}``."""
    if not args.generate_json:
        return
    index = {c: i for i, c in enumerate(classes(args))}
    for split, samples in splits.items():
        targets = {
            f"{s.label}/{os.path.basename(str(s.source))}": index[str(s.label)] for s in samples
        }
        path = os.path.abspath(os.path.join(args.output, f"{split}_targets.json"))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(targets, f)
        print(f"{split}: targets -> {path}")


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_imagenet_data_files.py",
    doc=__doc__ or "",
    name="imagenet1k_filelist",
    read=read,
    fmt="filelist",
    formats=("filelist",),
    add_arguments=_arguments,
    classes=classes,
    after=write_targets,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

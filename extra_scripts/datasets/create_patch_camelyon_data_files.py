#!/usr/bin/env python3
"""Write PatchCamelyon as VISSL's ``patch_camelyon_folder`` (``pcam_folder`` in VISSL 0.1.6).

Reads the published HDF5 files (gunzipped) in INPUT::

    INPUT/camelyonpatch_level_2_split_{train,valid,test}_x.h5     "x": N x 96 x 96 x 3 uint8
    INPUT/camelyonpatch_level_2_split_{train,valid,test}_y.h5     "y": N x 1 x 1 x 1 (0 / 1)

and writes ``OUTPUT/{train,val,test}/{no_tumor,tumor}/img_<i>.png`` (test only when its
files are there). Reading HDF5 needs h5py (``pip install h5py``).

examples:
  python extra_scripts/datasets/create_patch_camelyon_data_files.py -i /data/pcam -o /data/patch_camelyon

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, ScriptError, require_file, run

#: Output split -> PCam's file split.
SPLITS = {"train": "train", "val": "valid", "test": "test"}
FILE = "camelyonpatch_level_2_split_{split}_{xy}.h5"


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as err:
        raise ScriptError("reading PatchCamelyon's .h5 files needs h5py: pip install h5py") from err
    return h5py


def _image(images: Any, idx: int) -> Callable[[], Image.Image]:
    return lambda: Image.fromarray(np.asarray(images[idx], dtype=np.uint8))


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    h5py = _h5py()
    splits: dict[str, list[Sample]] = {}
    for out, split in SPLITS.items():
        x_path = os.path.join(args.input, FILE.format(split=split, xy="x"))
        if split == "test" and not os.path.isfile(x_path):
            continue
        require_file(x_path, f"PCam's {split} images")
        y_path = require_file(
            os.path.join(args.input, FILE.format(split=split, xy="y")), f"PCam's {split} labels"
        )
        images = h5py.File(x_path, "r")["x"]
        labels = np.asarray(h5py.File(y_path, "r")["y"]).reshape(-1)
        if len(labels) != len(images):
            raise ScriptError(f"{x_path} has {len(images)} images, {y_path} {len(labels)} labels.")
        splits[out] = [
            Sample(_image(images, i), "tumor" if labels[i] == 1 else "no_tumor", f"img_{i}.png")
            for i in range(len(labels))
        ]
    return splits


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_patch_camelyon_data_files.py",
    doc=__doc__ or "",
    name="patch_camelyon_folder",
    read=read,
    downloads=("https://zenodo.org/record/2546921/files/",),
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

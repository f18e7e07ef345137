#!/usr/bin/env python3
"""Export the embedded digits data set as an image folder: OUT/{train,test}/<class>/<idx>.png.

The images are those of vissl's ``digits`` data source (scikit-learn's 8x8 digits, grey
levels scaled to 0..255), with its fixed TRAIN (1438) and TEST (359) split, so a run on
the folder (``disk_folder``, or ``disk_filelist`` after
``extra_scripts/create_disk_filelist.py``) sees the same data as ``DATA_SOURCES:
[digits]``. Classes are the folders ``0`` .. ``9``; ``<idx>`` is the image's index in
its vissl split, zero-padded so that file order is index order. Images are saved as
8-bit greyscale PNGs (vissl reads them as RGB, as the data source gives them);
``--size`` upscales them with nearest-neighbour resampling, which keeps every pixel value.

examples:
  python extra_scripts/export_digits_image_folder.py /tmp/digits
  python extra_scripts/export_digits_image_folder.py /tmp/digits32 --size 32
  python tools/run_distributed_engines.py config=quick_start \\
      config.DATA.TRAIN.DATA_SOURCES=[disk_folder] config.DATA.TRAIN.DATA_PATHS=[/tmp/digits/train]

Exit codes: 0 written, 2 a bad argument or a non-empty output folder (one line on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from _common import HelpFormatter, ScriptError, run_script
from PIL import Image

from vissl.config.attr_dict import AttrDict
from vissl.data.data_sources.digits import DigitsDataset

#: vissl split -> folder name.
SPLITS = {"TRAIN": "train", "TEST": "test"}
#: The side of the digits images as the data source gives them.
NATIVE_SIZE = 8


def digits_source(split: str) -> DigitsDataset:
    """vissl's ``digits`` data source of ``split`` (``TRAIN`` or ``TEST``)."""
    cfg = AttrDict({"DATA": {split: {}}})
    return DigitsDataset(cfg, "", split, "digits")


def export(
    out: str, size: int = NATIVE_SIZE, splits: Sequence[str] = ("TRAIN", "TEST")
) -> dict[str, int]:
    """Write the digits of ``splits`` under ``out``; return the number of images per folder.

    Raises:
        ScriptError: ``size`` is below 1.
    """
    if size < 1:
        raise ScriptError(f"--size must be a positive number of pixels; got {size}.")
    counts: dict[str, int] = {}
    for split in splits:
        source = digits_source(split)
        labels = source.get_labels()
        width = len(str(len(source) - 1))
        folder = os.path.join(out, SPLITS[split])
        for cls in sorted({int(c) for c in labels}):
            os.makedirs(os.path.join(folder, str(cls)), exist_ok=True)
        for idx in range(len(source)):
            image, _ = source[idx]
            grey = image.convert("L")  # the three channels are equal
            if size != NATIVE_SIZE:
                grey = grey.resize((size, size), Image.Resampling.NEAREST)
            grey.save(os.path.join(folder, str(int(labels[idx])), f"{idx:0{width}d}.png"))
        counts[SPLITS[split]] = len(source)
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="extra_scripts/export_digits_image_folder.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("out", help="the folder to write (missing or empty)")
    parser.add_argument(
        "--size",
        type=int,
        default=NATIVE_SIZE,
        help="side of the written images in pixels (nearest-neighbour upscaling)",
    )
    parser.add_argument(
        "--splits",
        nargs="+",
        choices=sorted(SPLITS.values()),
        default=sorted(SPLITS.values()),
        help="which splits to write",
    )
    args = parser.parse_args(argv)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ScriptError(f"{args.out} exists and is not a folder.")
    if os.path.isdir(args.out) and os.listdir(args.out):
        raise ScriptError(f"{args.out} is not empty; give a new or empty folder.")
    wanted = [s for s, name in SPLITS.items() if name in args.splits]
    counts = export(args.out, args.size, wanted)
    summary = ", ".join(f"{name} {n}" for name, n in counts.items())
    print(
        f"wrote {sum(counts.values())} digits ({summary}; {args.size}x{args.size} px) to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

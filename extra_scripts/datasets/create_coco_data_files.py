#!/usr/bin/env python3
"""Write COCO 2014 as multi-label ``disk_filelist`` files (VISSL's ``coco_folder``).

Reads the published archives (train2014.zip, val2014.zip, annotations_trainval2014.zip)
extracted into INPUT::

    INPUT/train2014/COCO_train2014_000000000009.jpg
    INPUT/val2014/COCO_val2014_000000000042.jpg
    INPUT/annotations/instances_{train,val,minival,valminusminival}2014.json

(``--json_annotations_dir``, ``--train_imgs_path`` and ``--val_imgs_path`` point elsewhere;
minival and valminusminival, present or not, are drawn from val2014) and writes, per
partition whose annotation file exists, ``OUTPUT/<partition>_images.npy`` and
``OUTPUT/<partition>_labels.npy``: an (N, 80) int32 matrix, 1 where the image has a valid
object of the category (categories in the file's order), else 0. An object counts when it
is not ``ignore``, its area is positive and its box, clipped to the image, is larger than
one pixel each way (as VISSL's script, without pycocotools).

examples:
  python extra_scripts/datasets/create_coco_data_files.py -i /data/coco -o /data/coco_filelists

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _dataset_files import DatasetScript, Sample, ScriptError, run

PARTITIONS = ("train", "val", "minival", "valminusminival")


def valid_object(obj: dict[str, Any], width: float, height: float) -> bool:
    """Whether ``obj`` counts as a label: not ignored, positive area, a clipped box larger
    than one pixel each way (``bbox`` is x, y, w, h)."""
    if obj.get("ignore", 0) == 1:
        return False
    x, y, w, h = (float(v) for v in obj["bbox"])
    x1 = min(width - 1.0, max(0.0, x))
    y1 = min(height - 1.0, max(0.0, y))
    x2 = min(width - 1.0, max(0.0, x + max(0.0, w - 1.0)))
    y2 = min(height - 1.0, max(0.0, y + max(0.0, h - 1.0)))
    return float(obj.get("area", 0)) > 0 and x2 > x1 and y2 > y1


def read_partition(path: str, image_dir: str) -> list[Sample]:
    """The samples of one ``instances_*.json``, sorted by file name."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        categories = [c["id"] for c in data["categories"]]
        images = {im["id"]: im for im in data["images"]}
        annotations = data.get("annotations", [])
    except (OSError, ValueError, KeyError) as err:
        raise ScriptError(f"{path} is not a COCO instances file: {err}") from err
    column = {cat: i for i, cat in enumerate(categories)}
    rows = {im_id: np.zeros(len(categories), dtype=np.int32) for im_id in images}
    for obj in annotations:
        image = images.get(obj["image_id"])
        if image is not None and valid_object(obj, image["width"], image["height"]):
            rows[obj["image_id"]][column[obj["category_id"]]] = 1
    by_name = sorted((images[i]["file_name"], rows[i]) for i in images)
    return [Sample(os.path.join(image_dir, name), row) for name, row in by_name]


def read(args: argparse.Namespace) -> dict[str, list[Sample]]:
    if args.input is None and not args.json_annotations_dir:
        raise ScriptError("give -i/--input INPUT or --json_annotations_dir.")
    root = args.input or os.path.dirname(os.path.abspath(args.json_annotations_dir))
    ann_dir = args.json_annotations_dir or os.path.join(root, "annotations")
    splits = {}
    for partition in PARTITIONS:
        path = os.path.join(ann_dir, f"instances_{partition}2014.json")
        if not os.path.isfile(path):
            continue
        if partition == "train":
            image_dir = args.train_imgs_path or os.path.join(root, "train2014")
        else:
            image_dir = args.val_imgs_path or os.path.join(root, "val2014")
        splits[partition] = read_partition(path, image_dir)
    if "train" not in splits or "val" not in splits:
        raise ScriptError(
            f"{ann_dir} needs instances_train2014.json and instances_val2014.json "
            "(from annotations_trainval2014.zip)."
        )
    return splits


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json_annotations_dir", default=None, help="default INPUT/annotations")
    parser.add_argument("--train_imgs_path", default=None, help="default INPUT/train2014")
    parser.add_argument("--val_imgs_path", default=None, help="default INPUT/val2014")


SPEC = DatasetScript(
    prog="extra_scripts/datasets/create_coco_data_files.py",
    doc=__doc__ or "",
    name="coco_folder",
    read=read,
    fmt="filelist",
    formats=("filelist",),
    downloads=(
        "http://images.cocodataset.org/zips/train2014.zip",
        "http://images.cocodataset.org/zips/val2014.zip",
        "http://images.cocodataset.org/annotations/annotations_trainval2014.zip",
    ),
    add_arguments=_arguments,
    input_required=False,
)

if __name__ == "__main__":
    sys.exit(run(SPEC, sys.argv[1:]))

#!/usr/bin/env python3
"""Write VISSL's ``disk_filelist`` files of PASCAL VOC (2007 or 2012) from the VOCdevkit layout.

From the published layout of one year's folder::

    VOC2007/JPEGImages/<id>.jpg
    VOC2007/Annotations/<id>.xml
    VOC2007/ImageSets/Main/<class>_<split>.txt     "<id> <1 | -1 | 0>" per line
    VOC2007/ImageSets/Main/<split>.txt             "<id>" per line

it writes, per partition, what the ``disk_filelist`` data and label sources read::

    OUTPUT_DIR/<partition>_images.npy   1-D array of image paths (absolute)
    OUTPUT_DIR/<partition>_labels.npy   (N, C) int32 multi-label rows, classes sorted by
                                        name (VOC's 20: aeroplane ... tvmonitor):
                                        1 present, 0 absent, -1 ignored ("difficult" only)

VOC's per-class files say 1 (present), -1 (absent) and 0 (only difficult objects); the
targets turn them into 1, 0 and -1, as VISSL's script does. Partitions: ``train`` and
``test``: VOC2007's ``trainval`` and ``test``; without ``test`` files (VOC2012),
``train`` and ``val``. With ``--separate_partitions 1``: ``train``, ``val`` and ``test``
from the files of those names. ``--labels_from annotations`` reads the image ids of
``ImageSets/Main/<split>.txt`` and derives the rows from the XML annotations instead (a
class is 1 with a non-difficult object, -1 with only difficult ones, else 0: how the
devkit's per-class files were made). ``--generate_json 1`` adds
``<partition>_targets.json``: ``{image id: {class: target}}``.

The files serve ``tools/train_svm.py`` (benchmark/svm/voc07) and linear evaluation with
``bce_logits_multiple_output_single_target`` and ``mean_ap_list_meter``
(benchmark/linear_image_classification/voc07)::

  config.DATA.TRAIN.DATA_PATHS=[OUT/train_images.npy] config.DATA.TRAIN.LABEL_PATHS=[OUT/train_labels.npy]
  config.DATA.TEST.DATA_PATHS=[OUT/test_images.npy] config.DATA.TEST.LABEL_PATHS=[OUT/test_labels.npy]

examples:
  python extra_scripts/datasets/create_voc_data_files.py \\
      --data_source_dir /data/VOCdevkit/VOC2007 --output_dir /data/voc07_filelists
  python extra_scripts/datasets/create_voc_data_files.py \\
      --data_source_dir /data/VOCdevkit/VOC2012 --output_dir /data/voc12 --separate_partitions 1

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _common import HelpFormatter, ScriptError, run_script

#: PASCAL VOC's 20 classes, in the (alphabetical) order of the label columns.
VOC_CLASSES = (
    "aeroplane",
    "bicycle",
    "bird",
    "boat",
    "bottle",
    "bus",
    "car",
    "cat",
    "chair",
    "cow",
    "diningtable",
    "dog",
    "horse",
    "motorbike",
    "person",
    "pottedplant",
    "sheep",
    "sofa",
    "train",
    "tvmonitor",
)

#: VOC's per-class file values -> training targets (present, absent, difficult-only).
_VOC_TO_TARGET = {1: 1, -1: 0, 0: -1}


def _main_dir(root: str) -> str:
    folder = os.path.join(root, "ImageSets", "Main")
    if not os.path.isdir(folder):
        raise ScriptError(
            f"{folder} does not exist: give --data_source_dir the VOC year folder (e.g. "
            "VOCdevkit/VOC2007) holding ImageSets/Main, JPEGImages and Annotations."
        )
    return folder


def class_files(root: str, split: str) -> dict[str, str]:
    """``{class: ImageSets/Main/<class>_<split>.txt}`` (files named ``<class>_<split>.txt``
    only, as VISSL's ``validate_files``)."""
    folder = _main_dir(root)
    found = {}
    for name in os.listdir(folder):
        stem, ext = os.path.splitext(name)
        parts = stem.split("_")
        if ext == ".txt" and len(parts) == 2 and parts[1] == split:
            found[parts[0]] = os.path.join(folder, name)
    return dict(sorted(found.items()))


def partition_splits(root: str, separate: bool) -> dict[str, str]:
    """``{partition: VOC split}``: train/test from trainval/test (VOC2012: train/val), or
    train/val/test with ``separate``."""
    if separate:
        return {"train": "train", "val": "val", "test": "test"}
    if class_files(root, "test"):
        return {"train": "trainval", "test": "test"}
    return {"train": "train", "test": "val"}


def _read_ids(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.split()[0] for line in f if line.strip()]


def labels_from_image_sets(root: str, split: str) -> tuple[list[str], dict[str, np.ndarray]]:
    """Classes and ``{image id: row}`` from ``<class>_<split>.txt``; an image a class file
    does not list keeps -1 for that class (VISSL's default).

    Raises:
        ScriptError: no class file for ``split``, or a malformed line.
    """
    files = class_files(root, split)
    if not files:
        raise ScriptError(f"no ImageSets/Main/<class>_{split}.txt files in {root}.")
    classes = list(files)
    rows: dict[str, np.ndarray] = {}
    for c, path in enumerate(files.values()):
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                parts = line.split()
                if len(parts) != 2 or parts[1] not in ("1", "-1", "0"):
                    raise ScriptError(
                        f"{path}:{number}: expected '<image id> <1|-1|0>', got {line.strip()!r}."
                    )
                row = rows.setdefault(parts[0], np.full(len(classes), -1, dtype=np.int32))
                row[c] = _VOC_TO_TARGET[int(parts[1])]
    return classes, rows


def _objects(path: str) -> list[tuple[str, bool]]:
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError) as err:
        raise ScriptError(f"cannot read the annotation {path}: {err}") from err
    found = []
    for obj in tree.getroot().iter("object"):
        name = (obj.findtext("name") or "").strip()
        difficult = (obj.findtext("difficult") or "0").strip() == "1"
        found.append((name, difficult))
    return found


def labels_from_annotations(root: str, split: str) -> tuple[list[str], dict[str, np.ndarray]]:
    """VOC's 20 classes and ``{image id: row}`` of the ids in ``ImageSets/Main/<split>.txt``,
    from ``Annotations/<id>.xml``.

    Raises:
        ScriptError: the id list or an annotation is missing, or names an unknown class.
    """
    ids_file = os.path.join(_main_dir(root), f"{split}.txt")
    if not os.path.isfile(ids_file):
        raise ScriptError(f"{ids_file} does not exist (the image ids of split {split!r}).")
    index = {cls: i for i, cls in enumerate(VOC_CLASSES)}
    rows = {}
    for image_id in _read_ids(ids_file):
        row = np.zeros(len(VOC_CLASSES), dtype=np.int32)
        seen: dict[str, bool] = {}  # class -> has a non-difficult object
        for name, difficult in _objects(os.path.join(root, "Annotations", f"{image_id}.xml")):
            if name not in index:
                raise ScriptError(
                    f"Annotations/{image_id}.xml names the class {name!r}, not one of VOC's 20."
                )
            seen[name] = seen.get(name, False) or not difficult
        for name, clear in seen.items():
            row[index[name]] = 1 if clear else -1
        rows[image_id] = row
    return list(VOC_CLASSES), rows


def write_partition(
    root: str, out: str, partition: str, split: str, labels_from: str, generate_json: bool
) -> tuple[str, str, int]:
    """Write ``<partition>_images.npy`` / ``_labels.npy`` (and ``_targets.json``).

    Returns:
        (images file, labels file, number of images).

    Raises:
        ScriptError: missing images or annotations (see the readers).
    """
    reader = labels_from_annotations if labels_from == "annotations" else labels_from_image_sets
    classes, rows = reader(root, split)
    ids = sorted(rows)
    image_dir = os.path.abspath(os.path.join(root, "JPEGImages"))
    paths = [os.path.join(image_dir, f"{i}.jpg") for i in ids]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ScriptError(
            f"{len(missing)} image(s) of split {split!r} are missing from {image_dir}, "
            f"e.g. {os.path.basename(missing[0])}."
        )
    labels = np.stack([rows[i] for i in ids]) if ids else np.zeros((0, len(classes)), np.int32)
    images_file = os.path.abspath(os.path.join(out, f"{partition}_images.npy"))
    labels_file = os.path.abspath(os.path.join(out, f"{partition}_labels.npy"))
    np.save(images_file, np.asarray(paths, dtype=str))
    np.save(labels_file, labels.astype(np.int32))
    if generate_json:
        targets = {i: {cls: int(v) for cls, v in zip(classes, rows[i], strict=True)} for i in ids}
        with open(os.path.join(out, f"{partition}_targets.json"), "w", encoding="utf-8") as f:
            json.dump(targets, f)
    return images_file, labels_file, len(ids)


def create_voc_data_files(
    data_source_dir: str,
    output_dir: str,
    separate_partitions: bool = False,
    generate_json: bool = False,
    labels_from: str = "image_sets",
) -> dict[str, tuple[str, str, int]]:
    """Write every partition's files; returns ``{partition: (images, labels, count)}``.

    Raises:
        ScriptError: the folder is not a VOC year folder, or the partitions disagree on the
            classes.
    """
    if not os.path.isdir(data_source_dir):
        raise ScriptError(f"--data_source_dir {data_source_dir} is not a folder.")
    os.makedirs(output_dir, exist_ok=True)
    splits = partition_splits(data_source_dir, separate_partitions)
    if labels_from == "image_sets":
        per_split = {s: list(class_files(data_source_dir, s)) for s in splits.values()}
        if len({tuple(c) for c in per_split.values()}) > 1:
            raise ScriptError(
                "the splits do not list the same classes: "
                + "; ".join(f"{s}: {len(c)} classes" for s, c in per_split.items())
                + " (missing ImageSets/Main/<class>_<split>.txt files?)."
            )
    return {
        partition: write_partition(
            data_source_dir, output_dir, partition, split, labels_from, generate_json
        )
        for partition, split in splits.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="create_voc_data_files.py",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--data_source_dir",
        required=True,
        help="the VOC year folder holding ImageSets, JPEGImages and Annotations",
    )
    parser.add_argument("--output_dir", required=True, help="where the .npy files are written")
    parser.add_argument(
        "--separate_partitions",
        type=int,
        default=0,
        help="1: write train, val and test from the files of those names",
    )
    parser.add_argument(
        "--generate_json", type=int, default=0, help="1: also write <partition>_targets.json"
    )
    parser.add_argument(
        "--labels_from",
        choices=("image_sets", "annotations"),
        default="image_sets",
        help="read the targets from ImageSets/Main/<class>_<split>.txt or Annotations/*.xml",
    )
    args = parser.parse_args(argv)
    written = create_voc_data_files(
        args.data_source_dir,
        args.output_dir,
        bool(args.separate_partitions),
        bool(args.generate_json),
        args.labels_from,
    )
    for partition, (images, labels, count) in written.items():
        print(f"{partition}: {count} images -> {images}, {labels}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

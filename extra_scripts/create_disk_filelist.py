#!/usr/bin/env python3
"""Write the ``disk_filelist`` files of an image folder: one image list and one label file per split.

From ``ROOT/<split>/<class>/<image>`` (split folders ``train``, ``val``, ``test``) or
``ROOT/<class>/<image>`` (one split, ``--split``, default ``train``) it writes, per split,
what vissl's ``disk_filelist`` data source and label source read:

  OUT/<split>_images.npy   1-D array of absolute image paths (str), memory-mappable
  OUT/<split>_labels.npy   1-D int64 array of class indices, one per image
  OUT/classes.json         the class names, index i = label i

Images are found as torchvision's ``ImageFolder`` (and vissl's ``disk_folder``) finds
them: extensions .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp, files sorted, classes
sorted by name. One class list, the sorted union over the splits, numbers every split,
so a class missing from one split does not shift the labels of the others; when every
split has every class, the labels are those ``disk_folder`` gives.

The files serve every benchmark that reads images and labels per split: training, linear
evaluation, kNN (``tools/nearest_neighbor_test.py``), SVM and low-shot
(``tools/low_shot_test.py`` draws its k-per-class samples from the TRAIN split itself).
Give them to a config as

  config.DATA.TRAIN.DATA_SOURCES=[disk_filelist] config.DATA.TRAIN.LABEL_SOURCES=[disk_filelist]
  config.DATA.TRAIN.DATA_PATHS=[OUT/train_images.npy] config.DATA.TRAIN.LABEL_PATHS=[OUT/train_labels.npy]

or register them in a dataset catalog under ``--name`` and set only
``config.DATA.TRAIN.DATASET_NAMES=[NAME]`` (TRAIN reads the entry's ``train`` split, TEST
its ``val``, else ``test``). The catalog entry is always printed; ``--catalog FILE`` adds
it to FILE (created if missing), e.g. configs/config/dataset_catalog.json, or a file of
your own named by ``$VISSL_DATASET_CATALOG_PATH``.

examples:
  python extra_scripts/create_disk_filelist.py /data/my_images /data/my_images_filelists
  python extra_scripts/create_disk_filelist.py /data/flowers /data/flowers_filelists \\
      --name flowers_filelist --catalog configs/config/dataset_catalog.json
  python extra_scripts/create_disk_filelist.py /data/unsplit_images out --split val

Exit codes: 0 written, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from _common import HelpFormatter, ScriptError, run_script
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

#: Split folder names, in the order they are written (the catalog's split keys).
SPLIT_NAMES = ("train", "val", "test")


@dataclass(frozen=True)
class SplitFiles:
    """What was written for one split."""

    split: str
    images: str
    labels: str
    num_images: int
    num_classes: int


def _subdirs(folder: str) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def find_splits(root: str, split: str | None) -> dict[str, str]:
    """``{split name: folder of class folders}`` of ``root``.

    Args:
        root: the image folder.
        split: the split name of a ``root`` whose sub-folders are the classes; None to
            detect: ``root`` has split folders when its sub-folders are all split names.

    Raises:
        ScriptError: ``root`` is not a folder, has no sub-folders, or mixes split folders
            with other folders.
    """
    if not os.path.isdir(root):
        raise ScriptError(
            f"{root} is not a folder; give ROOT/<class>/<image> or ROOT/<split>/<class>/<image>."
        )
    subdirs = _subdirs(root)
    if not subdirs:
        raise ScriptError(f"{root} has no sub-folders: put the images in one folder per class.")
    if split is not None:
        return {split: root}
    named = [d for d in subdirs if d in SPLIT_NAMES]
    if not named:
        return {"train": root}
    if len(named) != len(subdirs):
        others = [d for d in subdirs if d not in SPLIT_NAMES]
        raise ScriptError(
            f"{root} mixes split folders {named} with other folders {others[:5]}: use "
            f"ROOT/<split>/<class>/<image> with splits among {list(SPLIT_NAMES)}, or give "
            "--split to read ROOT's sub-folders as classes."
        )
    return {name: os.path.join(root, name) for name in SPLIT_NAMES if name in named}


def scan(splits: dict[str, str]) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    """The classes (sorted union over the splits) and each split's ``(path, label)`` list.

    Raises:
        ScriptError: a split has no class folder or no image.
    """
    per_split_classes = {}
    for name, folder in splits.items():
        classes = _subdirs(folder)
        if not classes:
            raise ScriptError(f"split {name!r} ({folder}) has no class folders.")
        per_split_classes[name] = classes
    classes = sorted(set().union(*per_split_classes.values()))
    class_to_idx = {c: i for i, c in enumerate(classes)}
    samples: dict[str, list[tuple[str, int]]] = {}
    for name, folder in splits.items():
        found = make_dataset(
            os.path.abspath(folder), class_to_idx, extensions=IMG_EXTENSIONS, allow_empty=True
        )
        if not found:
            raise ScriptError(
                f"split {name!r} ({folder}) holds no images with an extension among "
                f"{', '.join(IMG_EXTENSIONS)}."
            )
        present = {label for _, label in found}
        missing = [c for i, c in enumerate(classes) if i not in present]
        if missing:
            print(
                f"warning: split {name!r} has no images of {len(missing)} class(es): "
                f"{missing[:10]}",
                file=sys.stderr,
            )
        samples[name] = found
    return classes, samples


def write_filelists(
    root: str, out: str, split: str | None = None
) -> tuple[list[str], list[SplitFiles]]:
    """Write ``<split>_images.npy``, ``<split>_labels.npy`` and ``classes.json`` into ``out``.

    Returns:
        (classes, what was written per split).

    Raises:
        ScriptError: ``out`` is inside ``root``; see also :func:`find_splits` and :func:`scan`.
    """
    root_abs, out_abs = os.path.realpath(root), os.path.realpath(out)
    if os.path.commonpath([root_abs, out_abs]) == root_abs:
        raise ScriptError(
            f"the output folder {out} is inside the image folder {root}, where it would be "
            "read as a class (or a split) next time; write it elsewhere."
        )
    classes, samples = scan(find_splits(root, split))
    os.makedirs(out, exist_ok=True)
    written = []
    for name, found in samples.items():
        paths = np.asarray([p for p, _ in found], dtype=str)  # fixed-width str: memory-mappable
        labels = np.asarray([label for _, label in found], dtype=np.int64)
        images_file = os.path.abspath(os.path.join(out, f"{name}_images.npy"))
        labels_file = os.path.abspath(os.path.join(out, f"{name}_labels.npy"))
        np.save(images_file, paths)
        np.save(labels_file, labels)
        written.append(
            SplitFiles(name, images_file, labels_file, len(found), len(set(labels.tolist())))
        )
    with open(os.path.join(out, "classes.json"), "w", encoding="utf-8") as f:
        json.dump(classes, f, indent=1)
        f.write("\n")
    return classes, written


def catalog_entry(written: Sequence[SplitFiles]) -> dict[str, list[str]]:
    """The dataset catalog entry: ``{split: [images .npy, labels .npy]}``."""
    return {w.split: [w.images, w.labels] for w in written}


def add_to_catalog(catalog: str, name: str, entry: dict[str, list[str]], force: bool) -> None:
    """Add ``name: entry`` to the JSON catalog file ``catalog`` (created if missing).

    Raises:
        ScriptError: the file is not a JSON object, or already has ``name`` without ``force``.
    """
    data: dict[str, object] = {}
    if os.path.exists(catalog):
        try:
            with open(catalog, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as err:
            raise ScriptError(f"--catalog {catalog} cannot be read as JSON: {err}") from err
        if not isinstance(data, dict):
            raise ScriptError(f"--catalog {catalog} does not hold a JSON object of datasets.")
        if name in data and not force:
            raise ScriptError(
                f"--catalog {catalog} already has a dataset {name!r}; pick another --name or "
                "add --force to replace it."
            )
    data[name] = entry
    folder = os.path.dirname(os.path.abspath(catalog))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{catalog}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=4)
        f.write("\n")
    os.replace(tmp, catalog)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="extra_scripts/create_disk_filelist.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "root", help="the image folder: ROOT/<split>/<class>/<image> or ROOT/<class>/<image>"
    )
    parser.add_argument("out", help="the folder to write the .npy files into")
    parser.add_argument(
        "--split",
        choices=SPLIT_NAMES,
        default=None,
        help="read ROOT's sub-folders as the classes of this one split (default: detect "
        "split folders, else train)",
    )
    parser.add_argument(
        "--name",
        default=None,
        help="dataset name of the catalog entry (default: ROOT's folder name + '_filelist')",
    )
    parser.add_argument(
        "--catalog", default=None, help="add the entry to this dataset catalog JSON file"
    )
    parser.add_argument(
        "--force", action="store_true", help="replace an entry of the same name in --catalog"
    )
    args = parser.parse_args(argv)
    root = args.root.rstrip(os.sep) or args.root
    name = args.name or f"{os.path.basename(os.path.abspath(root))}_filelist"
    classes, written = write_filelists(root, args.out, args.split)
    for w in written:
        print(
            f"{w.split}: {w.num_images} images of {w.num_classes} classes -> {w.images}, {w.labels}"
        )
    print(f"{len(classes)} classes -> {os.path.abspath(os.path.join(args.out, 'classes.json'))}")
    entry = catalog_entry(written)
    if args.catalog:
        add_to_catalog(args.catalog, name, entry, args.force)
        print(f"added {name!r} to the dataset catalog {args.catalog}")
    else:
        print("dataset catalog entry (add it with --catalog FILE):")
    print(json.dumps({name: entry}, indent=4))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

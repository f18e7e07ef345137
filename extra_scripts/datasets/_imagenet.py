"""ImageNet's class list: what the ImageNet-A/-R/-Sketch and subset scripts map labels with."""

from __future__ import annotations

import argparse
import os

from _dataset_files import Sample, ScriptError, class_folder_samples, read_lines, subdirs


def add_classes_argument(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "--imagenet_classes",
        required=required,
        help="ImageNet-1k's 1000 WordNet ids: a text file, one id per line (VISSL's "
        "imagenet_classes.txt), or the ImageNet train folder whose sub-folders they are",
    )


def imagenet_classes(path: str) -> list[str]:
    """The sorted WordNet ids of ImageNet-1k (label i = the i-th), from a file or a folder.

    Raises:
        ScriptError: the path is missing or lists no id.
    """
    if os.path.isdir(path):
        ids = subdirs(path)
    elif os.path.isfile(path):
        ids = [line.split()[0] for line in read_lines(path)]
    else:
        raise ScriptError(f"--imagenet_classes {path} is neither a file nor a folder.")
    if not ids:
        raise ScriptError(f"--imagenet_classes {path} lists no WordNet id.")
    return sorted(set(ids))


def imagenet_labelled(folder: str, classes: list[str]) -> list[Sample]:
    """``folder/<wnid>/<image>`` -> samples whose label is the wnid's ImageNet-1k index.

    Raises:
        ScriptError: a class folder is not an ImageNet-1k id.
    """
    index = {c: i for i, c in enumerate(classes)}
    samples = class_folder_samples(folder)
    unknown = sorted({str(s.label) for s in samples} - set(index))
    if unknown:
        raise ScriptError(
            f"class folders {unknown[:5]} of {folder} are not among the {len(classes)} "
            "ImageNet classes of --imagenet_classes."
        )
    return [Sample(s.source, index[str(s.label)]) for s in samples]

"""Places' list files: what create_places205 / create_places365 read."""

from __future__ import annotations

import os

from _dataset_files import Sample, ScriptError, read_lines, require_file


def class_folder(index: int, category: str) -> str:
    """``(3, "/a/amusement_park")`` -> ``003_amusement_park``: sorted like the labels."""
    parts = [p for p in category.strip("/").split("/") if p]
    return f"{index:03d}_" + "_".join(parts[1:] if len(parts) > 1 else parts)


def read_list(path: str, image_root: str) -> list[tuple[str, int]]:
    """``(image path, label)`` of each ``<relative path> <label>`` line.

    Raises:
        ScriptError: a line has no integer label.
    """
    pairs = []
    for number, line in enumerate(read_lines(require_file(path, "a list of images")), start=1):
        parts = line.split()
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise ScriptError(f"{path}:{number}: expected '<image> <label>', got {line!r}.")
        pairs.append((os.path.join(image_root, parts[0].lstrip("/")), int(parts[1])))
    return pairs


def to_samples(pairs: list[tuple[str, int]], classes: list[str], path: str) -> list[Sample]:
    """Samples labelled with their class folder name; ScriptError for an unknown label."""
    samples = []
    for image, label in pairs:
        if not 0 <= label < len(classes):
            raise ScriptError(f"{path}: label {label} of {image} is not in 0..{len(classes) - 1}.")
        samples.append(Sample(image, classes[label]))
    return samples

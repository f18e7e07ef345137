"""CLEVR v1.0's scenes: what create_clevr_count / create_clevr_dist read (VTAB's tasks)."""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Callable
from typing import Any

from _dataset_files import Sample, ScriptError, require_dir, require_file

#: The upper bounds of the closest-object depth bins of clevr_dist (VTAB's).
DIST_THRESHOLDS = (8.0, 8.5, 9.0, 9.5, 10.0, 100.0)


def count_label(scene: dict[str, Any]) -> str:
    """clevr_count: the number of objects, ``count_<n>``."""
    return f"count_{len(scene['objects'])}"


def dist_label(scene: dict[str, Any]) -> str:
    """clevr_dist: the bin of the closest object's depth (pixel_coords[2]), ``below_<t>``."""
    depth = min(obj["pixel_coords"][2] for obj in scene["objects"])
    index = min(bisect.bisect_left(DIST_THRESHOLDS, depth), len(DIST_THRESHOLDS) - 1)
    return f"below_{DIST_THRESHOLDS[index]}"


def read_clevr(
    root: str, label_of: Callable[[dict[str, Any]], str], keep_train_classes: bool
) -> dict[str, list[Sample]]:
    """``{train, val}`` samples of ``root/CLEVR_v1.0``; with ``keep_train_classes`` val keeps
    only the labels train has (clevr_count, as VISSL).

    Raises:
        ScriptError: a scenes file is missing or malformed.
    """
    base = require_dir(os.path.join(root, "CLEVR_v1.0"), "images/ and scenes/ of CLEVR v1.0")
    splits: dict[str, list[Sample]] = {}
    for split in ("train", "val"):
        path = require_file(
            os.path.join(base, "scenes", f"CLEVR_{split}_scenes.json"), f"the {split} scenes"
        )
        with open(path, encoding="utf-8") as f:
            try:
                scenes = json.load(f)["scenes"]
            except (ValueError, KeyError) as err:
                raise ScriptError(f"{path} is not a CLEVR scenes file: {err}") from err
        image_dir = os.path.join(base, "images", split)
        splits[split] = [
            Sample(os.path.join(image_dir, s["image_filename"]), label_of(s)) for s in scenes
        ]
    if keep_train_classes:
        known = {s.label for s in splits["train"]}
        splits["val"] = [s for s in splits["val"] if s.label in known]
    return splits

"""smallNORB's binary matrices: what create_small_norb_azimuth / _elevation read (VTAB)."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from _dataset_files import Sample, ScriptError, require_file
from PIL import Image

#: The published file stems (after gunzip) of the two parts.
PARTS = {
    "train": "smallnorb-5x46789x9x18x6x2x96x96-training",
    "test": "smallnorb-5x01235x9x18x6x2x96x96-testing",
}
#: The element types of the format's magic numbers (little endian).
DTYPES = {
    0x1E3D4C51: "<f4",
    0x1E3D4C53: "<f8",
    0x1E3D4C54: "<i4",
    0x1E3D4C55: "<u1",
    0x1E3D4C56: "<i2",
}
ELEVATIONS = (30, 35, 40, 45, 50, 55, 60, 65, 70)


def read_matrix(path: str) -> np.ndarray:
    """A smallNORB matrix file: magic, ndim, then at least 3 dims (int32 LE), then data.

    Raises:
        ScriptError: the file is not in the format.
    """
    with open(require_file(path, "a smallNORB matrix file"), "rb") as f:
        raw = f.read()
    header = np.frombuffer(raw, dtype="<i4", count=2) if len(raw) >= 8 else np.zeros(0)
    if len(header) < 2 or int(header[0]) not in DTYPES or not 0 < int(header[1]) < 10:
        raise ScriptError(f"{path} is not a smallNORB matrix file (bad header).")
    ndim = int(header[1])
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype="<i4", count=ndim, offset=8))
    offset = 4 * max(5, 2 + ndim)  # the header always holds 3 dims at least
    data = np.frombuffer(raw, dtype=DTYPES[int(header[0])], offset=offset)
    if data.size != int(np.prod(shape)):
        raise ScriptError(f"{path}: {data.size} values for the shape {shape}.")
    return data.reshape(shape)


def elevation(info: np.ndarray) -> np.ndarray:
    """Elevation in degrees (info column 1 indexes 30..70 by 5)."""
    return np.asarray(ELEVATIONS)[info[:, 1]]


def azimuth(info: np.ndarray) -> np.ndarray:
    """Azimuth in degrees (info column 2 is 0, 2, ..., 34; times 10)."""
    return info[:, 2] * 10


def _image(images: np.ndarray, idx: int) -> Callable[[], Image.Image]:
    return lambda: Image.fromarray(images[idx, 0].astype(np.uint8), mode="L").convert("RGB")


def read_small_norb(
    root: str, target: Callable[[np.ndarray], np.ndarray]
) -> dict[str, list[Sample]]:
    """``{train, test}``: the first image of each stereo pair, labelled ``target(info)``."""
    splits = {}
    for split, stem in PARTS.items():
        images = read_matrix(os.path.join(root, f"{stem}-dat.mat"))
        info = read_matrix(os.path.join(root, f"{stem}-info.mat"))
        if images.ndim != 4 or len(images) != len(info):
            raise ScriptError(f"{stem}: {images.shape} images for {len(info)} info rows.")
        labels = target(info)
        splits[split] = [
            Sample(_image(images, i), str(int(labels[i])), f"image_{i}.png")
            for i in range(len(labels))
        ]
    return splits

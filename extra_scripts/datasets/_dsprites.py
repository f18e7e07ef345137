"""dSprites' npz: what create_dsprites_location / _orientation read (VTAB's tasks)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np
from _dataset_files import Sample, ScriptError, random_split, require_file
from PIL import Image

NPZ = os.path.join("dsprites-dataset-master", "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz")
#: Bins of both tasks.
NUM_BINS = 16


def location_bin(latents: np.ndarray) -> int:
    """dsprites_loc: the x position (latent 4, in [0, 1], 32 values) in 16 bins."""
    return math.floor(float(latents[4]) * 31 * NUM_BINS / 32)


def orientation_bin(latents: np.ndarray) -> int:
    """dsprites_orient: the orientation (latent 3, in [0, 2 pi]) in 16 bins."""
    value = math.floor(float(latents[3]) / (2 * math.pi) * NUM_BINS)
    return min(max(value, 0), NUM_BINS - 1)


def _image(images: np.ndarray, idx: int) -> Callable[[], Image.Image]:
    return lambda: Image.fromarray((images[idx] * 255).astype(np.uint8), mode="L").convert("RGB")


def read_dsprites(
    root: str, bin_of: Callable[[np.ndarray], int], train_fraction: float, seed: int
) -> dict[str, list[Sample]]:
    """``{train, val}`` samples (images made from the npz, labels ``bin_<k>``), split at
    random with ``train_fraction`` in train."""
    path = require_file(os.path.join(root, NPZ), "the dSprites npz (dsprites-dataset-master)")
    try:
        data = np.load(path)
        images, latents = data["imgs"], data["latents_values"]
    except (OSError, ValueError, KeyError) as err:
        raise ScriptError(f"{path} is not the dSprites npz (imgs, latents_values): {err}") from err
    samples = [
        Sample(_image(images, i), f"bin_{bin_of(latents[i])}", f"image_{i}.png")
        for i in range(len(images))
    ]
    parts = random_split(range(len(samples)), {"train": train_fraction, "val": 1.0}, seed)
    return {name: [samples[i] for i in idx] for name, idx in parts.items()}

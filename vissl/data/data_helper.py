"""Small helpers shared by data sources and the dataset: gray images, sub-sampling."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from vissl.errors import ConfigError

#: Pixel value of the gray image returned for unreadable files (as in VISSL).
GRAY_VALUE = 128


def get_mean_image(crop_size: int) -> Image.Image:
    """A gray ``crop_size x crop_size`` RGB PIL image (VISSL's placeholder image).

    Args:
        crop_size: height and width of the image.

    Returns:
        The image, every pixel ``(128, 128, 128)``.
    """
    size = int(crop_size)
    return Image.new("RGB", (size, size), (GRAY_VALUE, GRAY_VALUE, GRAY_VALUE))


def split_cfg_value(split_cfg: Any, key: str, default: Any) -> Any:
    """``split_cfg[key]`` or ``default`` when the key is absent (partial configs)."""
    try:
        return split_cfg[key]
    except (KeyError, TypeError):
        return default


def unbalanced_sub_sampling(
    total_size: int, nb_samples: int, skip_samples: int = 0, seed: int = 0
) -> np.ndarray:
    """Pick ``nb_samples`` distinct indices of ``range(total_size)``, deterministically.

    The same ``seed`` gives the same indices in every process. The first
    ``skip_samples`` indices of the seeded permutation are skipped, so several
    disjoint subsets can be drawn with the same seed.

    Args:
        total_size: size of the full data set.
        nb_samples: how many indices to return.
        skip_samples: how many indices of the permutation to skip first.
        seed: seed of the permutation.

    Returns:
        An int64 array of ``nb_samples`` indices.
    """
    rng = np.random.RandomState(seed)
    perm = rng.permutation(total_size)
    return perm[skip_samples : skip_samples + nb_samples].astype(np.int64)


def balanced_sub_sampling(
    labels: Sequence[Any] | np.ndarray, nb_samples: int, skip_samples: int = 0, seed: int = 0
) -> np.ndarray:
    """Pick ``nb_samples`` indices so that class counts differ by at most one.

    Classes are sorted; the first ``nb_samples % num_classes`` classes get one extra
    sample (VISSL's rule). Deterministic given ``seed``.

    Args:
        labels: one label per sample of the full data set.
        nb_samples: how many indices to return.
        skip_samples: how many samples (spread over the classes the same way) to skip.
        seed: seed of the per-class permutations.

    Returns:
        An int64 array of indices, grouped by class in sorted class order.

    Raises:
        ValueError: if a class has too few samples or ``nb_samples`` is smaller than
            the number of classes.
    """
    groups: dict[Any, list[int]] = {}
    for i, label in enumerate(np.asarray(labels).tolist()):
        groups.setdefault(label, []).append(i)
    classes = sorted(groups)
    q, r = divmod(nb_samples, len(classes))
    sq, sr = divmod(skip_samples, len(classes))
    if q == 0:
        raise ValueError(
            f"a balanced subset of {nb_samples} samples needs at least one sample per "
            f"class, but there are {len(classes)} classes"
        )
    rng = np.random.RandomState(seed)
    chosen = []
    for i, label in enumerate(classes):
        take = q + (1 if i < r else 0)
        skip = sq + (1 if i < sr else 0)
        members = np.asarray(groups[label], dtype=np.int64)
        if skip + take > len(members):
            raise ValueError(
                f"class {label!r} has {len(members)} samples, fewer than the "
                f"{skip + take} a balanced subset needs"
            )
        chosen.append(rng.permutation(members)[skip : skip + take])
    return np.concatenate(chosen).astype(np.int64)


def require(condition: bool, message: str, key_path: str) -> None:
    """Raise :class:`ConfigError` naming ``key_path`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(f"{key_path}: {message}", key_path)


def load_array_file(path: str, *, mmap: bool, key_path: str) -> np.ndarray:
    """Load a ``.npy`` file (or a ``.txt`` file, one entry per line) as an array.

    With ``mmap`` the ``.npy`` file is memory-mapped when its dtype allows it (not for
    pickled object arrays, which are then loaded normally).

    Args:
        path: the file.
        mmap: try to memory-map it (``MMAP_MODE``).
        key_path: the config key naming the file, for error messages.

    Returns:
        The array.

    Raises:
        ConfigError: if the file is missing or not a supported format.
    """
    from iopath.common.file_io import g_pathmgr

    if not isinstance(path, str) or not g_pathmgr.isfile(path):
        raise ConfigError(
            f"{key_path}: file {path!r} does not exist. Give the path of a .npy file.",
            key_path,
        )
    if path.endswith(".txt"):
        with g_pathmgr.open(path, "r") as f:
            return np.asarray([line.rstrip("\n") for line in f if line.strip()])
    if not path.endswith(".npy"):
        raise ConfigError(
            f"{key_path}: {path!r} is not a .npy (or .txt) file; save the list with np.save.",
            key_path,
        )
    local = g_pathmgr.get_local_path(path)
    if mmap:
        try:
            return np.load(local, mmap_mode="r", allow_pickle=False)
        except ValueError:
            pass  # object arrays cannot be memory-mapped
    try:
        return np.load(local, allow_pickle=True)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{key_path}: cannot read {path!r} as a .npy file: {err}", key_path
        ) from err

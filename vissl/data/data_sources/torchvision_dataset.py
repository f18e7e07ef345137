"""``torchvision_dataset``: CIFAR10, CIFAR100, STL10, MNIST and SVHN from files on disk.

The dataset is chosen by the ``DATASET_NAMES`` entry (VISSL's names) and read with
``torchvision.datasets`` from the folder in ``DATA_PATHS`` (or the dataset catalog), with
``download=False``: nothing is ever downloaded. The folder holds what torchvision's
download would have unpacked there:

=========================  ================================================================
``CIFAR10``                ``cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``
``CIFAR100``               ``cifar-100-python/{train,test,meta}``
``STL10``                  ``stl10_binary/{train_X,train_y,unlabeled_X,test_X,test_y}.bin``
``MNIST``                  ``MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``
``SVHN``                   ``train_32x32.mat`` and/or ``test_32x32.mat`` (needs scipy)
=========================  ================================================================

torchvision checks the md5 of the CIFAR, STL10 and SVHN files, so they must be the
original files. ``STL10_unlabeled`` and ``STL10_train+unlabeled`` (TRAIN only) read
STL10's unlabeled images, whose label is -1.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from iopath.common.file_io import g_pathmgr
from PIL import Image
from torchvision.datasets import CIFAR10, CIFAR100, MNIST, STL10, SVHN
from torchvision.datasets.utils import check_integrity

from vissl.config.attr_dict import AttrDict
from vissl.data.data_sources import register_data_source
from vissl.data.data_sources.base import DataSource
from vissl.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _TorchvisionSpec:
    """A torchvision dataset class and its constructor arguments per vissl split."""

    cls: type[Any]
    splits: dict[str, dict[str, Any]] = field(default_factory=dict)


#: VISSL's dataset names -> how to build them.
TORCHVISION_DATASETS: dict[str, _TorchvisionSpec] = {
    "CIFAR10": _TorchvisionSpec(CIFAR10, {"TRAIN": {"train": True}, "TEST": {"train": False}}),
    "CIFAR100": _TorchvisionSpec(CIFAR100, {"TRAIN": {"train": True}, "TEST": {"train": False}}),
    "STL10": _TorchvisionSpec(STL10, {"TRAIN": {"split": "train"}, "TEST": {"split": "test"}}),
    "STL10_unlabeled": _TorchvisionSpec(STL10, {"TRAIN": {"split": "unlabeled"}}),
    "STL10_train+unlabeled": _TorchvisionSpec(STL10, {"TRAIN": {"split": "train+unlabeled"}}),
    "MNIST": _TorchvisionSpec(MNIST, {"TRAIN": {"train": True}, "TEST": {"train": False}}),
    "SVHN": _TorchvisionSpec(SVHN, {"TRAIN": {"split": "train"}, "TEST": {"split": "test"}}),
}


def expected_files(cls: type[Any], root: str, kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    """The files (and md5, or None) that ``cls(root, **kwargs)`` checks before reading.

    Read from the torchvision class itself, so the list follows the installed version.
    """
    if issubclass(cls, MNIST):
        raw = os.path.join(root, cls.__name__, "raw")
        names = [os.path.splitext(os.path.basename(url))[0] for url, _ in cls.resources]
        return [(os.path.join(raw, name), None) for name in names]
    if issubclass(cls, SVHN):
        _, filename, md5 = cls.split_list[kwargs["split"]]
        return [(os.path.join(root, filename), md5)]
    files = [
        (os.path.join(root, cls.base_folder, name), md5)
        for name, md5 in [*cls.train_list, *cls.test_list]
    ]
    if issubclass(cls, CIFAR10):
        files.append((os.path.join(root, cls.base_folder, cls.meta["filename"]), cls.meta["md5"]))
    return files


@register_data_source("torchvision_dataset")
class TorchvisionDataset(DataSource):
    """A ``torchvision.datasets`` dataset read from disk, named by ``DATASET_NAMES``.

    Names: ``CIFAR10``, ``CIFAR100``, ``STL10``, ``MNIST``, ``SVHN`` (TRAIN reads the
    train split, TEST the test split) and ``STL10_unlabeled`` / ``STL10_train+unlabeled``
    (TRAIN only). Images are RGB PIL images (MNIST's gray images are copied to three
    channels); its own labels are the dataset's class indices (-1 for STL10's unlabeled
    images). Nothing is downloaded: missing files are a ConfigError listing them.
    """

    NAMES = tuple(TORCHVISION_DATASETS)

    def __init__(
        self,
        cfg: AttrDict,
        path: str,
        split: str,
        dataset_name: str,
        data_source: str = "torchvision_dataset",
    ) -> None:
        super().__init__(cfg, path, split, dataset_name, data_source)
        names_key = f"config.DATA.{split}.DATASET_NAMES"
        spec = TORCHVISION_DATASETS.get(dataset_name)
        if spec is None:
            close = [n for n in self.NAMES if n.lower() == str(dataset_name).lower()]
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{names_key}: data source {data_source!r} reads the dataset named in "
                f"DATASET_NAMES, one of {list(self.NAMES)}; got {dataset_name!r}.{hint}",
                names_key,
            )
        if split not in spec.splits:
            raise ConfigError(
                f"{names_key}: {dataset_name!r} has no {split} split (it has "
                f"{sorted(spec.splits)}); use 'STL10' for TEST.",
                names_key,
            )
        if not isinstance(path, str) or not path or not g_pathmgr.isdir(path):
            raise ConfigError(
                f"{self.key_path}: directory {path!r} for data source {data_source!r} "
                f"({dataset_name}) does not exist. Give the folder that holds the "
                f"{dataset_name} files torchvision reads (see docs/components.md); nothing "
                "is downloaded.",
                self.key_path,
            )
        root = g_pathmgr.get_local_path(path)
        kwargs = spec.splits[split]
        try:
            self.dataset = spec.cls(root, download=False, **kwargs)
        except Exception as err:  # torchvision: RuntimeError, or a parse error of a bad file
            raise self._files_error(spec.cls, root, kwargs, err) from err
        targets = getattr(self.dataset, "targets", None)
        if targets is None:
            targets = self.dataset.labels
        self._labels = np.asarray(targets, dtype=np.int64).reshape(-1)
        logger.info(
            "Loaded %d images of torchvision %s (%s) from %s",
            len(self._labels),
            dataset_name,
            kwargs,
            path,
        )

    def _files_error(
        self, cls: type[Any], root: str, kwargs: dict[str, Any], err: Exception
    ) -> ConfigError:
        files = expected_files(cls, root, kwargs)
        missing = [p for p, _ in files if not os.path.isfile(p)]
        corrupt = [
            p for p, md5 in files if p not in missing and md5 and not check_integrity(p, md5)
        ]
        listing = ", ".join(os.path.relpath(p, root) for p, _ in files)
        if missing:
            what = "is missing " + ", ".join(missing)
        elif corrupt:
            what = (
                "has files that fail torchvision's md5 check (not the original files?): "
                + ", ".join(corrupt)
            )
        else:
            what = f"could not be read by torchvision: {type(err).__name__}: {err}"
        return ConfigError(
            f"{self.key_path}: {self.dataset_name} ({cls.__name__}, {kwargs}) in "
            f"{self.path!r} {what}. torchvision.datasets.{cls.__name__} expects under that "
            f"folder: {listing}. Nothing is downloaded: put the original {self.dataset_name} "
            "files there (e.g. unpack the archive torchvision downloads) or fix DATA_PATHS.",
            self.key_path,
        )

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, idx: int) -> tuple[Image.Image, bool]:
        image = self.dataset[idx][0]
        if image.mode != "RGB":
            image = image.convert("RGB")
        return image, True

    def get_labels(self) -> np.ndarray:
        return self._labels.copy()

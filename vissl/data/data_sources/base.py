"""The data source contract, and a base class implementing the shared parts.

A data source reads one data set of one split. ``GenericSSLDataset`` builds it as
``cls(cfg=cfg, path=path, split=split, dataset_name=name, data_source=source_name)`` and
calls ``source[idx]`` to get ``(image, is_valid)``; ``len(source)`` is its size.
Optional methods: ``get_labels()`` (its own labels, used by ``LABEL_TYPE: standard``)
and ``get_image_paths()``.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from vissl.config.attr_dict import AttrDict
from vissl.data.data_helper import split_cfg_value


class DataSource(Dataset[tuple[Image.Image, bool]]):
    """Base class of vissl's data sources.

    Args:
        cfg: the full config (``cfg.DATA.<split>...``).
        path: the entry of ``DATA_PATHS`` for this source ("" when not needed).
        split: ``"TRAIN"`` or ``"TEST"``.
        dataset_name: the entry of ``DATASET_NAMES`` (the catalog key; ``torchvision_dataset``
            reads it to pick the data set).
        data_source: the registered name this source was selected by.
    """

    #: Whether the source needs an entry in ``DATA_PATHS``.
    requires_path: ClassVar[bool] = True

    def __init__(
        self, cfg: AttrDict, path: str, split: str, dataset_name: str, data_source: str
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.path = path
        self.split = split
        self.dataset_name = dataset_name
        self.data_source = data_source
        self.split_cfg = cfg["DATA"][split]
        self.gray_img_size = int(split_cfg_value(self.split_cfg, "DEFAULT_GRAY_IMG_SIZE", 224))

    @property
    def key_path(self) -> str:
        """The config key path of this split's data paths, for error messages."""
        return f"config.DATA.{self.split}.DATA_PATHS"

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, idx: int) -> tuple[Image.Image, bool]:
        raise NotImplementedError

    def get_labels(self) -> np.ndarray | None:
        """The source's own labels (int64, one per sample), or None if it has none."""
        return None

    def get_image_paths(self) -> list[str]:
        """Paths of the images, for sources read from disk (empty otherwise)."""
        return []

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(source={self.data_source!r}, split={self.split!r}, "
            f"path={self.path!r}, size={len(self)})"
        )

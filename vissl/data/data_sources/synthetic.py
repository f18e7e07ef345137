"""``synthetic``: reproducible random RGB images, for tests and benchmarks."""

from __future__ import annotations

import zlib

import numpy as np
from PIL import Image

from vissl.config.attr_dict import AttrDict
from vissl.data.data_helper import split_cfg_value
from vissl.data.data_sources import register_data_source
from vissl.data.data_sources.base import DataSource


@register_data_source("synthetic")
class SyntheticImageDataset(DataSource):
    """Random images whose content depends only on (seed, split, index).

    Every process (and every data loader worker) returns the same image for the same
    index. Each image is a class colour plus per-pixel noise, so a classifier can
    learn the labels; the label of index ``i`` is ``i % NUM_CLASSES``.

    Size: ``DATA_LIMIT`` when it is positive, else 50000 (VISSL's default). Images are
    ``DEFAULT_GRAY_IMG_SIZE`` square. The seed is ``SEED_VALUE``. ``DATA_PATHS`` is
    not needed.
    """

    requires_path = False
    #: Default number of samples when DATA_LIMIT is not positive (as in VISSL).
    DEFAULT_NUM_SAMPLES = 50000
    NUM_CLASSES = 10

    def __init__(
        self,
        cfg: AttrDict,
        path: str,
        split: str,
        dataset_name: str,
        data_source: str = "synthetic",
    ) -> None:
        super().__init__(cfg, path, split, dataset_name, data_source)
        limit = int(split_cfg_value(self.split_cfg, "DATA_LIMIT", -1))
        self._num_samples = limit if limit > 0 else self.DEFAULT_NUM_SAMPLES
        self.seed = int(cfg.get("SEED_VALUE", 0))
        self._split_key = zlib.crc32(split.encode())
        palette_rng = np.random.default_rng([self.seed, 7919])
        self._palette = palette_rng.integers(32, 224, size=(self.NUM_CLASSES, 3))

    def __len__(self) -> int:
        return self._num_samples

    def __getitem__(self, idx: int) -> tuple[Image.Image, bool]:
        if not 0 <= idx < self._num_samples:
            raise IndexError(f"index {idx} out of range for {self._num_samples} samples")
        rng = np.random.default_rng([self.seed, self._split_key, int(idx)])
        size = self.gray_img_size
        noise = rng.integers(-32, 33, size=(size, size, 3))
        pixels = np.clip(self._palette[idx % self.NUM_CLASSES] + noise, 0, 255)
        return Image.fromarray(pixels.astype(np.uint8)), True

    def get_labels(self) -> np.ndarray:
        return np.arange(self._num_samples, dtype=np.int64) % self.NUM_CLASSES

"""``synthetic``: reproducible random RGB images, for tests and benchmarks."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import torch
from PIL import Image

from vissl.config.attr_dict import AttrDict
from vissl.data.data_helper import split_cfg_value
from vissl.data.data_sources import register_data_source
from vissl.data.data_sources.base import DataSource
from vissl.errors import ConfigError

_MASK64 = (1 << 64) - 1


def _mix64(*values: int) -> int:
    """A 64-bit hash of integers (splitmix64 steps): cheap, the same in every process."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        z = (state ^ (value & _MASK64)) + 0x9E3779B97F4A7C15 & _MASK64
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & _MASK64
        state = z ^ (z >> 31)
    return state


@register_data_source("synthetic")
class SyntheticImageDataset(DataSource):
    """Random images whose content depends only on (seed, split, index).

    Every process (and every data loader worker) returns the same image for the same
    index. Each image is a class colour plus per-pixel noise, so a classifier can
    learn the labels; the label of index ``i`` is ``i % num_classes``: 10 classes, or
    ``DATA.TRAIN.RANDOM_SYNTHETIC_LABELS`` when positive (VISSL's key, read for both
    splits as in VISSL).

    The noise is cheap: each class has one noise image, made once per process from the
    seed; index ``i`` gets it cyclically shifted by an offset and flipped as a hash of
    (seed, split, i) says (``size**2 * 4`` different images per class), about 30 us for a
    224 px image instead of the milliseconds of drawing fresh noise.

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
        self.num_classes = self._num_classes(cfg)
        self._palette = palette_rng.integers(32, 224, size=(self.num_classes, 3))
        # made on first use in each process (not pickled to the workers)
        self._class_images: list[np.ndarray] | None = None

    @classmethod
    def _num_classes(cls, cfg: AttrDict) -> int:
        key = "config.DATA.TRAIN.RANDOM_SYNTHETIC_LABELS"
        value = ((cfg.get("DATA") or {}).get("TRAIN") or {}).get("RANDOM_SYNTHETIC_LABELS", 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{key}={value!r} must be an integer >= 0 (0: 10 classes).", key)
        return value or cls.NUM_CLASSES

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_class_images"] = None
        return state

    def _images(self) -> list[np.ndarray]:
        if self._class_images is None:
            size = self.gray_img_size
            images = []
            for cls, colour in enumerate(self._palette):
                rng = np.random.default_rng([self.seed, self._split_key, 0x5EED, cls])
                noise = rng.integers(-32, 33, size=(size, size, 3))
                images.append(np.clip(colour + noise, 0, 255).astype(np.uint8))
            self._class_images = images
        return self._class_images

    def __len__(self) -> int:
        return self._num_samples

    def _pixels(self, idx: int) -> np.ndarray:
        if not 0 <= idx < self._num_samples:
            raise IndexError(f"index {idx} out of range for {self._num_samples} samples")
        size = self.gray_img_size
        code = _mix64(self.seed, self._split_key, int(idx))
        shift = (code % size, (code >> 20) % size)
        pixels = np.roll(self._images()[idx % self.num_classes], shift, axis=(0, 1))
        if code >> 62 & 1:
            pixels = pixels[::-1]
        if code >> 63:
            pixels = pixels[:, ::-1]
        return np.ascontiguousarray(pixels)

    def __getitem__(self, idx: int) -> tuple[Image.Image, bool]:
        return Image.fromarray(self._pixels(idx)), True

    def get_image_tensor(self, idx: int) -> tuple[torch.Tensor, bool]:
        """Image ``idx`` as a ``(3, H, W)`` uint8 tensor (the pixels of ``self[idx]``)."""
        return torch.from_numpy(self._pixels(idx)).permute(2, 0, 1), True

    def get_labels(self) -> np.ndarray:
        return np.arange(self._num_samples, dtype=np.int64) % self.num_classes

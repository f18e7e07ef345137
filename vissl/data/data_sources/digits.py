"""``digits``: scikit-learn's bundled 8x8 handwritten digits (no download needed)."""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image

from vissl.config.attr_dict import AttrDict
from vissl.data.data_sources import register_data_source
from vissl.data.data_sources.base import DataSource

#: Fraction of every class that goes to the TEST split.
TEST_FRACTION = 0.2
#: Seed of the fixed train/test split; never change it, results depend on it.
SPLIT_SEED = 0


@functools.lru_cache(maxsize=1)
def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # 0..16 grey levels -> 0..255
    images = np.rint(np.asarray(bunch.images, dtype=np.float64) * (255.0 / 16.0))
    return images.astype(np.uint8), np.asarray(bunch.target, dtype=np.int64)


@functools.lru_cache(maxsize=1)
def digits_split_indices() -> dict[str, np.ndarray]:
    """The fixed stratified split: ``{"TRAIN": idx, "TEST": idx}`` (sorted, disjoint).

    20% of every class (rounded) goes to TEST, chosen by a permutation seeded with
    ``SPLIT_SEED``; the result is the same on every machine and numpy version.
    """
    _, targets = _load_digits()
    rng = np.random.RandomState(SPLIT_SEED)
    test = []
    for cls in np.unique(targets):
        members = np.flatnonzero(targets == cls)
        n_test = round(len(members) * TEST_FRACTION)
        test.append(rng.permutation(members)[:n_test])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(targets)), test_idx)
    return {"TRAIN": train_idx.astype(np.int64), "TEST": test_idx.astype(np.int64)}


@register_data_source("digits")
class DigitsDataset(DataSource):
    """The 1797 digits of ``sklearn.datasets.load_digits`` as 8x8 RGB PIL images.

    Grey levels are scaled from 0..16 to 0..255 and copied to the three channels. The
    split is fixed and stratified: TRAIN has 1438 images, TEST 359, disjoint. Labels
    are the digits 0..9. ``DATA_PATHS`` is ignored.
    """

    requires_path = False
    NUM_CLASSES = 10

    def __init__(
        self,
        cfg: AttrDict,
        path: str,
        split: str,
        dataset_name: str,
        data_source: str = "digits",
    ) -> None:
        super().__init__(cfg, path, split, dataset_name, data_source)
        indices = digits_split_indices()["TEST" if split == "TEST" else "TRAIN"]
        images, targets = _load_digits()
        # ~100 KB: kept on the instance so workers need not import scikit-learn
        self._images = images[indices]
        self._targets = targets[indices]

    def __len__(self) -> int:
        return len(self._images)

    def __getitem__(self, idx: int) -> tuple[Image.Image, bool]:
        rgb = np.repeat(self._images[idx][:, :, None], 3, axis=2)
        return Image.fromarray(rgb), True

    def get_labels(self) -> np.ndarray:
        return self._targets.copy()

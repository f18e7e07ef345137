"""targets_one_hot_default_collator: VISSL's [positives, negatives] labels and multi-hot rows,
read through disk_filelist label files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.data.conftest import write_png
from vissl.data import build_collate_fn, build_dataset, get_collator
from vissl.errors import ConfigError

TRANSFORMS = [{"name": "ToTensor"}]


def _images(tmp_path: Path, n: int) -> str:
    paths = [str(write_png(tmp_path / f"img{i}.png", (10 * i, 0, 0))) for i in range(n)]
    np.save(tmp_path / "images.npy", np.array(paths))
    return str(tmp_path / "images.npy")


def test_positive_negative_label_files(tmp_path: Path, cfg_factory) -> None:
    """Two label files (positives, negatives), as VISSL's OpenImages configs use."""
    images = _images(tmp_path, 3)
    pos = np.empty(3, dtype=object)
    neg = np.empty(3, dtype=object)
    pos[:] = [[0, 2], [], [4]]
    neg[:] = [[1], [0, 3], []]
    np.save(tmp_path / "pos.npy", pos, allow_pickle=True)
    np.save(tmp_path / "neg.npy", neg, allow_pickle=True)
    cfg = cfg_factory(
        train={
            "DATA_SOURCES": ["disk_filelist"],
            "DATA_PATHS": [images],
            "LABEL_SOURCES": ["disk_filelist"],
            "LABEL_PATHS": [[str(tmp_path / "pos.npy"), str(tmp_path / "neg.npy")]],
            "TRANSFORMS": TRANSFORMS,
            "COLLATE_FUNCTION": "targets_one_hot_default_collator",
            "COLLATE_FUNCTION_PARAMS": {"num_classes": 5},
        }
    )
    ds = build_dataset(cfg, "TRAIN")
    batch = build_collate_fn(cfg, "TRAIN")([ds[i] for i in range(3)])
    assert batch["label"][0].tolist() == [
        [1, 0, 1, -1, -1],
        [0, -1, -1, 0, -1],
        [-1, -1, -1, -1, 1],
    ]
    assert batch["data"][0].shape == (3, 3, 6, 6)
    assert batch["data_idx"][0].tolist() == [0, 1, 2]
    assert batch["data_valid"][0].tolist() == [1, 1, 1]


def test_multi_hot_rows_pass_through(tmp_path: Path, cfg_factory) -> None:
    """VOC07's (N, C) label file: rows of 1 / 0 / -1 are kept as they are."""
    images = _images(tmp_path, 2)
    rows = np.array([[1, -1, 0, 0], [0, 1, 1, -1]], dtype=np.int32)
    np.save(tmp_path / "labels.npy", rows)
    cfg = cfg_factory(
        test={
            "DATA_SOURCES": ["disk_filelist"],
            "DATA_PATHS": [images],
            "LABEL_SOURCES": ["disk_filelist"],
            "LABEL_PATHS": [str(tmp_path / "labels.npy")],
            "TRANSFORMS": TRANSFORMS,
        }
    )
    ds = build_dataset(cfg, "TEST")
    out = get_collator("targets_one_hot_default_collator")([ds[0], ds[1]], num_classes=4)
    assert out["label"][0].tolist() == rows.tolist()


def test_errors_name_the_key() -> None:
    sample = {"data": [np.zeros(1)], "label": [[[7], []]], "data_valid": [1], "data_idx": [0]}
    collate = get_collator("targets_one_hot_default_collator")
    with pytest.raises(ConfigError, match="COLLATE_FUNCTION_PARAMS.num_classes"):
        collate([sample])
    with pytest.raises(ConfigError, match=r"class index 7 is outside \[0, 5\)"):
        collate([sample], num_classes=5)

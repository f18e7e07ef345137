"""Data sources: disk_folder, disk_filelist, synthetic, digits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vissl.data import build_dataset
from vissl.data.data_sources import get_data_source
from vissl.data.data_sources.digits import digits_split_indices
from vissl.errors import ConfigError


def test_disk_folder_reads_images_and_class_labels(cfg_factory, image_folder):
    cfg = cfg_factory(train={"DATA_SOURCES": ["disk_folder"], "DATA_PATHS": [str(image_folder)]})
    ds = build_dataset(cfg, "TRAIN")
    assert len(ds) == 4
    labels = [ds[i]["label"] for i in range(4)]
    assert labels == [[0], [0], [1], [1]]
    sample = ds[2]
    assert isinstance(sample["data"][0], Image.Image) and sample["data"][0].mode == "RGB"
    assert sample["data"][0].getpixel((0, 0)) == (10, 10, 200)
    assert sample["data_valid"] == [1] and sample["data_idx"] == [2]
    assert [Path(p).name for p in ds.get_image_paths()[0]] == ["0.png", "1.png"] * 2


def test_disk_folder_missing_path_names_data_paths(cfg_factory, tmp_path):
    cfg = cfg_factory(train={"DATA_SOURCES": ["disk_folder"], "DATA_PATHS": [str(tmp_path / "no")]})
    with pytest.raises(ConfigError, match=r"config\.DATA\.TRAIN\.DATA_PATHS") as info:
        build_dataset(cfg, "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.DATA_PATHS"


def test_disk_folder_without_images_is_config_error(cfg_factory, tmp_path):
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    cfg = cfg_factory(
        train={"DATA_SOURCES": ["disk_folder"], "DATA_PATHS": [str(tmp_path / "empty")]}
    )
    with pytest.raises(ConfigError, match="DATA_PATHS"):
        build_dataset(cfg, "TRAIN")


def test_unreadable_image_gives_gray_image_and_invalid_flag(cfg_factory, image_folder):
    (image_folder / "dog" / "1.png").write_bytes(b"not a png")
    cfg = cfg_factory(
        train={
            "DATA_SOURCES": ["disk_folder"],
            "DATA_PATHS": [str(image_folder)],
            "DEFAULT_GRAY_IMG_SIZE": 5,
        }
    )
    sample = build_dataset(cfg, "TRAIN")[3]
    assert sample["data_valid"] == [-1]
    img = sample["data"][0]
    assert img.size == (5, 5) and (np.asarray(img) == 128).all()
    assert sample["label"] == [1]


@pytest.mark.parametrize("mmap", [True, False])
def test_disk_filelist_with_npy_labels(cfg_factory, tmp_path, png_writer, mmap):
    paths = [str(png_writer(tmp_path / "imgs" / f"{i}.png", (i * 50, 0, 0))) for i in range(3)]
    np.save(tmp_path / "files.npy", np.array(paths))
    np.save(tmp_path / "labels.npy", np.array([2, 0, 1], dtype=np.int32))
    cfg = cfg_factory(
        train={
            "DATA_SOURCES": ["disk_filelist"],
            "DATA_PATHS": [str(tmp_path / "files.npy")],
            "LABEL_SOURCES": ["disk_filelist"],
            "LABEL_PATHS": [str(tmp_path / "labels.npy")],
            "MMAP_MODE": mmap,
        }
    )
    ds = build_dataset(cfg, "TRAIN")
    assert len(ds) == 3
    assert [ds[i]["label"] for i in range(3)] == [[2], [0], [1]]
    assert all(isinstance(ds[i]["label"][0], int) for i in range(3))
    assert ds[1]["data"][0].getpixel((0, 0)) == (50, 0, 0)


def test_disk_filelist_prefix_rewrite_and_string_labels(cfg_factory, tmp_path, png_writer):
    real = [png_writer(tmp_path / "real" / f"{i}.png", (0, i * 60, 0)) for i in range(2)]
    listed = np.array(
        [str(p).replace(str(tmp_path / "real"), "/old/place") for p in real], dtype=object
    )
    np.save(tmp_path / "files.npy", listed, allow_pickle=True)
    np.save(tmp_path / "labels.npy", np.array(["zebra", "ant"]))
    cfg = cfg_factory(
        train={
            "DATA_SOURCES": ["disk_filelist"],
            "DATA_PATHS": [str(tmp_path / "files.npy")],
            "LABEL_SOURCES": ["disk_filelist"],
            "LABEL_PATHS": [str(tmp_path / "labels.npy")],
            "REMOVE_IMG_PATH_PREFIX": "/old/place",
            "NEW_IMG_PATH_PREFIX": str(tmp_path / "real"),
        }
    )
    ds = build_dataset(cfg, "TRAIN")
    assert [ds[i]["data_valid"] for i in range(2)] == [[1], [1]]
    assert ds[1]["data"][0].getpixel((0, 0)) == (0, 60, 0)
    assert [ds[i]["label"] for i in range(2)] == [[1], [0]]  # sorted names: ant=0, zebra=1


def test_disk_filelist_errors_name_key_paths(cfg_factory, tmp_path, png_writer):
    np.save(tmp_path / "files.npy", np.array([str(png_writer(tmp_path / "a.png", (1, 2, 3)))]))
    base = {"DATA_SOURCES": ["disk_filelist"], "DATA_PATHS": [str(tmp_path / "files.npy")]}
    with pytest.raises(ConfigError, match=r"config\.DATA\.TRAIN\.DATA_PATHS"):
        build_dataset(cfg_factory(train={**base, "DATA_PATHS": [str(tmp_path / "x.npy")]}), "TRAIN")
    with pytest.raises(ConfigError, match=r"LABEL_PATHS\[0\]") as info:
        build_dataset(cfg_factory(train={**base, "LABEL_SOURCES": ["disk_filelist"]}), "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.LABEL_PATHS"
    np.save(tmp_path / "labels.npy", np.array([0, 1]))
    bad_len = {
        **base,
        "LABEL_SOURCES": ["disk_filelist"],
        "LABEL_PATHS": [str(tmp_path / "labels.npy")],
    }
    with pytest.raises(ConfigError, match=r"has \[2\] labels but the data has 1 samples"):
        build_dataset(cfg_factory(train=bad_len), "TRAIN")


def test_synthetic_is_deterministic_by_index_and_seed(cfg_factory):
    train = {"DATA_SOURCES": ["synthetic"], "DEFAULT_GRAY_IMG_SIZE": 12, "DATA_LIMIT": 20}
    a = build_dataset(cfg_factory(train=train, SEED_VALUE=3), "TRAIN")
    b = build_dataset(cfg_factory(train=train, SEED_VALUE=3), "TRAIN")
    c = build_dataset(cfg_factory(train=train, SEED_VALUE=4), "TRAIN")
    source_a, source_b, source_c = a.data_objs[0], b.data_objs[0], c.data_objs[0]
    img = np.asarray(source_a[5][0])
    assert img.shape == (12, 12, 3)
    assert np.array_equal(img, np.asarray(source_b[5][0]))
    assert np.array_equal(img, np.asarray(source_a[5][0]))
    assert not np.array_equal(img, np.asarray(source_a[6][0]))
    assert not np.array_equal(img, np.asarray(source_c[5][0]))
    assert source_a.get_labels().tolist() == [i % 10 for i in range(20)]


def test_synthetic_default_size_is_vissls():
    source_cls = get_data_source("synthetic")
    assert source_cls.DEFAULT_NUM_SAMPLES == 50000


def test_synthetic_length_without_limit(cfg_factory):
    ds = build_dataset(
        cfg_factory(train={"DATA_SOURCES": ["synthetic"], "DEFAULT_GRAY_IMG_SIZE": 4}), "TRAIN"
    )
    assert len(ds) == 50000
    assert ds[49999]["label"] == [9]


def test_digits_split_sizes_determinism_and_no_overlap(cfg_factory):
    cfg = cfg_factory(train={"DATA_SOURCES": ["digits"]}, test={"DATA_SOURCES": ["digits"]})
    train, test = build_dataset(cfg, "TRAIN"), build_dataset(cfg, "TEST")
    assert (len(train), len(test)) == (1438, 359)
    split = digits_split_indices()
    assert not set(split["TRAIN"].tolist()) & set(split["TEST"].tolist())
    assert len(set(split["TRAIN"].tolist()) | set(split["TEST"].tolist())) == 1797
    # stratified: every class is in both splits, about 20% in TEST
    test_labels = test.get_labels()
    counts = np.bincount(test_labels, minlength=10)
    assert counts.min() >= 34 and counts.max() <= 37
    again = build_dataset(cfg, "TEST")
    assert np.array_equal(again.get_labels(), test_labels)
    img = train[0]["data"][0]
    assert img.size == (8, 8) and img.mode == "RGB"
    pixels = np.asarray(img)
    assert pixels.dtype == np.uint8 and pixels.max() <= 255
    assert np.array_equal(pixels[..., 0], pixels[..., 2])


def test_digits_pixels_scaled_to_255(cfg_factory):
    from sklearn.datasets import load_digits

    ds = build_dataset(cfg_factory(test={"DATA_SOURCES": ["digits"]}), "TEST")
    raw = load_digits()
    split_index = digits_split_indices()["TEST"][0]
    expected = np.rint(raw.images[split_index] * 255 / 16).astype(np.uint8)
    assert np.array_equal(np.asarray(ds[0]["data"][0])[..., 1], expected)
    assert ds[0]["label"] == [int(raw.target[split_index])]

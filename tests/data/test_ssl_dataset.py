"""GenericSSLDataset: sample format, labels, DATA_LIMIT and config errors."""

from __future__ import annotations

import numpy as np
import pytest

from vissl.data import build_dataset
from vissl.errors import ConfigError, UnknownNameError

SYN = {"DATA_SOURCES": ["synthetic"], "DEFAULT_GRAY_IMG_SIZE": 4}


def test_sample_dict_format(cfg_factory):
    ds = build_dataset(cfg_factory(train={**SYN, "DATA_LIMIT": 10}), "TRAIN")
    sample = ds[3]
    assert set(sample) == {"data", "label", "data_valid", "data_idx"}
    assert len(sample["data"]) == 1
    assert sample["data_valid"] == [1] and sample["data_idx"] == [3]


def test_two_sources_give_one_entry_each(cfg_factory):
    cfg = cfg_factory(train={"DATA_SOURCES": ["digits", "digits"], "DATASET_NAMES": ["a", "b"]})
    sample = build_dataset(cfg, "TRAIN")[7]
    assert len(sample["data"]) == 2 and sample["data_idx"] == [7, 7]
    assert sample["label"][0] == sample["label"][1]


@pytest.mark.parametrize(
    ("label_type", "expected"), [("standard", [2]), ("sample_index", [12]), ("zero", [0])]
)
def test_label_type(cfg_factory, label_type, expected):
    ds = build_dataset(
        cfg_factory(train={**SYN, "DATA_LIMIT": 30, "LABEL_TYPE": label_type}), "TRAIN"
    )
    subset_idx = int(ds.sub_set[12])
    if label_type == "standard":
        expected = [subset_idx % 10]
    assert ds[12]["label"] == expected


def test_unknown_label_type_names_key(cfg_factory):
    with pytest.raises(ConfigError) as info:
        build_dataset(cfg_factory(train={**SYN, "LABEL_TYPE": "weird"}), "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.LABEL_TYPE"
    assert "sample_index" in str(info.value)


def test_label_sources_from_data_source(cfg_factory, image_folder):
    cfg = cfg_factory(
        test={
            "DATA_SOURCES": ["disk_folder"],
            "DATA_PATHS": [str(image_folder)],
            "LABEL_SOURCES": ["disk_folder"],
            "LABEL_PATHS": [str(image_folder)],
            "LABEL_TYPE": "sample_index",  # label sources win, as in VISSL
        }
    )
    ds = build_dataset(cfg, "TEST")
    assert [ds[i]["label"] for i in range(4)] == [[0], [0], [1], [1]]


def test_bad_label_source_is_config_error(cfg_factory):
    cfg = cfg_factory(train={**SYN, "LABEL_SOURCES": ["disk_folder"]})
    with pytest.raises(ConfigError) as info:
        build_dataset(cfg, "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.LABEL_SOURCES"


def test_mismatched_sources_and_paths_names_key(cfg_factory, image_folder):
    cfg = cfg_factory(
        train={"DATA_SOURCES": ["disk_folder", "disk_folder"], "DATA_PATHS": [str(image_folder)]}
    )
    with pytest.raises(ConfigError, match=r"config\.DATA\.TRAIN\.DATA_PATHS has 1 entries") as info:
        build_dataset(cfg, "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.DATA_PATHS"


def test_missing_paths_and_empty_sources(cfg_factory):
    with pytest.raises(ConfigError) as info:
        build_dataset(cfg_factory(test={"DATA_SOURCES": ["disk_folder"]}), "TEST")
    assert info.value.key_path == "config.DATA.TEST.DATA_PATHS"
    with pytest.raises(ConfigError) as info:
        build_dataset(cfg_factory(), "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.DATA_SOURCES"
    with pytest.raises(ConfigError) as info:
        build_dataset(cfg_factory(train={**SYN, "DATASET_NAMES": ["a", "b"]}), "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.DATASET_NAMES"


def test_unknown_data_source_lists_names(cfg_factory):
    with pytest.raises(UnknownNameError, match="disk_folder"):
        build_dataset(
            cfg_factory(train={"DATA_SOURCES": ["disk_foldr"], "DATA_PATHS": ["x"]}), "TRAIN"
        )


def test_data_limit_is_deterministic_subset(cfg_factory):
    def subset(**sampling):
        train = {
            "DATA_SOURCES": ["digits"],
            "DATA_LIMIT": 50,
            "DATA_LIMIT_SAMPLING": {
                "SEED": 0,
                "IS_BALANCED": False,
                "SKIP_NUM_SAMPLES": 0,
                **sampling,
            },
        }
        ds = build_dataset(cfg_factory(train=train), "TRAIN")
        assert len(ds) == 50
        return [int(ds.sub_set[i]) for i in range(50)]

    first = subset()
    assert first == subset() and len(set(first)) == 50
    assert first != subset(SEED=1)
    skipped = subset(SKIP_NUM_SAMPLES=50)
    assert not set(first) & set(skipped)


def test_data_limit_sample_uses_subset_index_for_data_and_idx_for_data_idx(cfg_factory):
    ds = build_dataset(cfg_factory(train={"DATA_SOURCES": ["digits"], "DATA_LIMIT": 5}), "TRAIN")
    full = build_dataset(cfg_factory(train={"DATA_SOURCES": ["digits"]}), "TRAIN")
    for i in range(5):
        j = int(ds.sub_set[i])
        assert ds[i]["data_idx"] == [i]
        assert ds[i]["label"] == full[j]["label"]
        assert np.array_equal(np.asarray(ds[i]["data"][0]), np.asarray(full[j]["data"][0]))


def test_balanced_data_limit(cfg_factory):
    train = {
        "DATA_SOURCES": ["digits"],
        "DATA_LIMIT": 25,
        "DATA_LIMIT_SAMPLING": {"SEED": 0, "IS_BALANCED": True, "SKIP_NUM_SAMPLES": 0},
    }
    ds = build_dataset(cfg_factory(train=train), "TRAIN")
    counts = np.bincount(ds.get_labels(), minlength=10)
    assert len(ds) == 25 and counts.tolist() == [3] * 5 + [2] * 5


def test_data_limit_errors(cfg_factory):
    with pytest.raises(ConfigError) as info:
        build_dataset(cfg_factory(test={"DATA_SOURCES": ["digits"], "DATA_LIMIT": 10_000}), "TEST")
    assert info.value.key_path == "config.DATA.TEST.DATA_LIMIT"
    with pytest.raises(ConfigError):
        build_dataset(cfg_factory(test={"DATA_SOURCES": ["digits"], "DATA_LIMIT": 0}), "TEST")
    too_few_for_classes = {
        "DATA_SOURCES": ["digits"],
        "DATA_LIMIT": 5,
        "DATA_LIMIT_SAMPLING": {"SEED": 0, "IS_BALANCED": True, "SKIP_NUM_SAMPLES": 0},
    }
    with pytest.raises(ConfigError, match="IS_BALANCED"):
        build_dataset(cfg_factory(train=too_few_for_classes), "TRAIN")


def test_standard_label_without_own_labels_is_minus_one(cfg_factory, tmp_path, png_writer):
    np.save(tmp_path / "f.npy", np.array([str(png_writer(tmp_path / "a.png", (1, 1, 1)))]))
    cfg = cfg_factory(
        train={"DATA_SOURCES": ["disk_filelist"], "DATA_PATHS": [str(tmp_path / "f.npy")]}
    )
    assert build_dataset(cfg, "TRAIN")[0]["label"] == [-1]

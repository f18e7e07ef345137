"""The dataset catalog: JSON parsing, split selection, registration and DATASET_NAMES lookup."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vissl.data import build_dataset
from vissl.data.dataset_catalog import (
    CATALOG_ENV,
    VisslDatasetCatalog,
    default_catalog_path,
    get_data_files,
)
from vissl.errors import ConfigError, DuplicateNameError, UnknownNameError

REPO_CATALOG = Path(__file__).resolve().parents[2] / "configs" / "config" / "dataset_catalog.json"


@pytest.fixture
def catalog(monkeypatch):
    """A fresh, process-wide catalog that reads the default file on first use."""
    monkeypatch.delenv(CATALOG_ENV, raising=False)
    monkeypatch.setattr(VisslDatasetCatalog, "_datasets", {})
    monkeypatch.setattr(VisslDatasetCatalog, "_defaults_loaded", False)
    return VisslDatasetCatalog


@pytest.fixture
def empty_catalog(catalog):
    """A fresh catalog without the default file's entries."""
    catalog.clear()
    return catalog


def write_catalog(path: Path, entries: object) -> Path:
    path.write_text(json.dumps(entries))
    return path


def test_default_catalog_file_is_found_and_parsed(catalog):
    assert default_catalog_path() == str(REPO_CATALOG)
    names = catalog.list()
    for name in ("imagenet1k_folder", "imagenet1k_filelist", "CIFAR10", "STL10", "MNIST", "SVHN"):
        assert name in names
    for name in names:
        entry = catalog.get(name)
        assert "train" in entry
        assert all(isinstance(v, list) and len(v) == 2 for v in entry.values())
    assert catalog.get("imagenet1k_filelist")["val"][1].endswith("val_labels.npy")


def test_register_json_and_dict(empty_catalog, tmp_path):
    path = write_catalog(
        tmp_path / "cat.json",
        {"a": {"train": ["/a/train", "/a/train_labels.npy"], "val": ["/a/val", ""]}},
    )
    empty_catalog.register_json(str(path))
    empty_catalog.register_dict({"b": {"test": ["/b/test", "<unused>"]}})
    assert sorted(empty_catalog.list()) == ["a", "b"]
    assert empty_catalog.has_data("a") and not empty_catalog.has_data("c")
    assert empty_catalog.get("a")["train"] == ["/a/train", "/a/train_labels.npy"]
    with pytest.raises(DuplicateNameError, match="'a' is already registered"):
        empty_catalog.register_dict({"a": {"train": ["/x", ""]}})
    empty_catalog.remove("a")
    assert empty_catalog.list() == ["b"]
    with pytest.raises(UnknownNameError, match=r"'a' is not registered.*Available datasets: b"):
        empty_catalog.get("a")


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "cannot be read"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"a": {"train": "/not/a/list"}}', r"entry 'a' must be a dict of splits"),
    ],
)
def test_bad_catalog_files_are_config_errors(empty_catalog, tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        empty_catalog.register_json(str(path))


def test_missing_catalog_file_is_config_error(empty_catalog, tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.json.*cannot be read"):
        empty_catalog.register_json(str(tmp_path / "nope.json"))


def test_env_var_overrides_the_default_catalog(catalog, monkeypatch, tmp_path):
    path = write_catalog(tmp_path / "mine.json", {"mine": {"train": [str(tmp_path), ""]}})
    monkeypatch.setenv(CATALOG_ENV, str(path))
    assert default_catalog_path() == str(path)
    assert catalog.list() == ["mine"]


def test_env_var_naming_a_missing_file_is_config_error(catalog, monkeypatch, tmp_path):
    monkeypatch.setenv(CATALOG_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match=rf"\${CATALOG_ENV}=.*missing\.json.*does not exist"):
        catalog.list()
    monkeypatch.delenv(CATALOG_ENV)
    assert "CIFAR10" in catalog.list()  # the default catalog is read on the next use


def test_split_selection_train_val_then_test(empty_catalog, tmp_path):
    dirs = {name: tmp_path / name for name in ("train", "val", "test")}
    for d in dirs.values():
        d.mkdir()
    empty_catalog.register_dict(
        {
            "all": {k: [str(d), ""] for k, d in dirs.items()},
            "no_val": {"train": [str(dirs["train"]), ""], "test": [str(dirs["test"]), ""]},
            "train_only": {"train": [str(dirs["train"]), ""]},
        }
    )
    assert get_data_files("TRAIN", ["all"], [True]) == ([str(dirs["train"])], [])
    assert get_data_files("TEST", ["all"], [True]) == ([str(dirs["val"])], [])
    assert get_data_files("TEST", ["no_val"], [True]) == ([str(dirs["test"])], [])
    # a source that needs no path is not looked up, even under an unknown name
    assert get_data_files("TEST", ["whatever", "all"], [False, True])[0] == ["", str(dirs["val"])]
    with pytest.raises(ConfigError, match=r"'train_only': .*no 'val' or 'test' split") as info:
        get_data_files("TEST", ["train_only"], [True])
    assert info.value.key_path == "config.DATA.TEST.DATASET_NAMES"


def test_unknown_name_lists_names_and_catalog_file(catalog, cfg_factory):
    cfg = cfg_factory(train={"DATA_SOURCES": ["disk_folder"], "DATASET_NAMES": ["nope"]})
    with pytest.raises(ConfigError) as info:
        build_dataset(cfg, "TRAIN")
    message = str(info.value)
    assert info.value.key_path == "config.DATA.TRAIN.DATASET_NAMES"
    assert "config.DATA.TRAIN.DATASET_NAMES[0]='nope' is not registered" in message
    assert str(REPO_CATALOG) in message
    assert "CIFAR10" in message and "imagenet1k_folder" in message
    assert "register_dict" in message and "DATA_PATHS" in message


def test_catalog_path_that_does_not_exist(empty_catalog, cfg_factory, tmp_path):
    empty_catalog.register_dict({"gone": {"train": [str(tmp_path / "gone"), ""]}})
    cfg = cfg_factory(train={"DATA_SOURCES": ["disk_folder"], "DATASET_NAMES": ["gone"]})
    with pytest.raises(ConfigError, match=r"points TRAIN at .*gone', which does not exist") as info:
        build_dataset(cfg, "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.DATASET_NAMES"


def test_empty_data_paths_without_names_mentions_the_catalog(catalog, cfg_factory):
    with pytest.raises(ConfigError, match=r"DATA_PATHS is empty.*dataset catalog") as info:
        build_dataset(cfg_factory(train={"DATA_SOURCES": ["disk_folder"]}), "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.DATA_PATHS"


def test_ssl_dataset_reads_disk_folder_paths_from_catalog(empty_catalog, cfg_factory, image_folder):
    val = image_folder.parent / "val"
    (val / "cat").mkdir(parents=True)
    (image_folder / "cat" / "0.png").rename(val / "cat" / "0.png")
    empty_catalog.register_dict(
        {"tiny": {"train": [str(image_folder), "<unused>"], "val": [str(val), "<unused>"]}}
    )
    source = {"DATA_SOURCES": ["disk_folder"], "DATASET_NAMES": ["tiny"]}
    cfg = cfg_factory(train=source, test=source)
    train, test = build_dataset(cfg, "TRAIN"), build_dataset(cfg, "TEST")
    assert train.paths_from_catalog and train.data_paths == [str(image_folder)]
    assert len(train) == 3 and len(test) == 1
    assert [train[i]["label"] for i in range(3)] == [[0], [1], [1]]
    assert train[0]["data"][0].mode == "RGB"
    assert test.get_image_paths() == [[str(val / "cat" / "0.png")]]


def test_data_paths_given_win_over_the_catalog(empty_catalog, cfg_factory, image_folder, tmp_path):
    empty_catalog.register_dict({"tiny": {"train": [str(tmp_path / "elsewhere"), ""]}})
    cfg = cfg_factory(
        train={
            "DATA_SOURCES": ["disk_folder"],
            "DATASET_NAMES": ["tiny"],
            "DATA_PATHS": [str(image_folder)],
        }
    )
    ds = build_dataset(cfg, "TRAIN")
    assert not ds.paths_from_catalog and len(ds) == 4


def test_disk_filelist_data_and_labels_from_catalog(
    empty_catalog, cfg_factory, tmp_path, png_writer
):
    paths = [str(png_writer(tmp_path / "imgs" / f"{i}.png", (i * 40, 0, 0))) for i in range(3)]
    np.save(tmp_path / "files.npy", np.array(paths))
    np.save(tmp_path / "labels.npy", np.array([2, 0, 1]))
    empty_catalog.register_dict(
        {"fl": {"train": [str(tmp_path / "files.npy"), str(tmp_path / "labels.npy")]}}
    )
    train = {
        "DATA_SOURCES": ["disk_filelist"],
        "DATASET_NAMES": ["fl"],
        "LABEL_SOURCES": ["disk_filelist"],
    }
    ds = build_dataset(cfg_factory(train=train), "TRAIN")
    assert ds.label_paths == [str(tmp_path / "labels.npy")]
    assert [ds[i]["label"] for i in range(3)] == [[2], [0], [1]]
    assert ds[1]["data"][0].getpixel((0, 0)) == (40, 0, 0)
    # LABEL_PATHS given wins over the catalog's label file
    np.save(tmp_path / "other.npy", np.array([5, 5, 5]))
    ds = build_dataset(
        cfg_factory(train={**train, "LABEL_PATHS": [str(tmp_path / "other.npy")]}), "TRAIN"
    )
    assert [ds[i]["label"] for i in range(3)] == [[5], [5], [5]]
    # a catalog entry without a label file, with a disk_filelist label source
    empty_catalog.register_dict({"nolabels": {"train": [str(tmp_path / "files.npy"), "<unused>"]}})
    with pytest.raises(ConfigError, match="no existing label file") as info:
        build_dataset(cfg_factory(train={**train, "DATASET_NAMES": ["nolabels"]}), "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.LABEL_PATHS"


def test_source_error_on_a_catalog_path_says_where_the_path_came_from(
    empty_catalog, cfg_factory, tmp_path
):
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    empty_catalog.register_dict({"empty": {"train": [str(tmp_path / "empty"), ""]}})
    cfg = cfg_factory(train={"DATA_SOURCES": ["disk_folder"], "DATASET_NAMES": ["empty"]})
    with pytest.raises(ConfigError, match=r"comes from the dataset catalog entry .*'empty'"):
        build_dataset(cfg, "TRAIN")

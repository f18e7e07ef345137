"""extra_scripts/datasets/create_voc_data_files.py: a fake VOCdevkit tree -> VISSL's
disk_filelist files, read back through the disk_filelist data and label sources."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.extra_scripts._helpers import EXTRA_SCRIPTS, assert_one_line_error, run_script
from tests.extra_scripts._voc import CLASSES, make_fake_voc
from vissl.config.attr_dict import AttrDict
from vissl.data import build_dataset
from vissl.utils.hydra_config import hydra_compose_and_validate

SCRIPT = "datasets/create_voc_data_files"


def _module() -> ModuleType:
    path = os.path.join(EXTRA_SCRIPTS, "datasets", "create_voc_data_files.py")
    spec = importlib.util.spec_from_file_location("create_voc_data_files", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("create_voc_data_files", module)
    spec.loader.exec_module(module)
    return module


voc = _module()


@pytest.fixture
def voc07(tmp_path: Path) -> tuple[Path, dict[str, dict[str, np.ndarray]]]:
    root = tmp_path / "VOCdevkit" / "VOC2007"
    return root, make_fake_voc(root, {"train": 6, "val": 5, "test": 7})


def _check(out: Path, partition: str, rows: dict[str, np.ndarray], root: Path) -> None:
    images = np.load(out / f"{partition}_images.npy")
    labels = np.load(out / f"{partition}_labels.npy")
    ids = sorted(rows)
    assert images.tolist() == [str((root / "JPEGImages" / f"{i}.jpg").resolve()) for i in ids]
    assert labels.dtype == np.int32 and labels.shape == (len(ids), len(CLASSES))
    assert labels.tolist() == [rows[i].tolist() for i in ids]


def test_voc07_trainval_and_test_from_image_sets(tmp_path: Path, voc07) -> None:
    root, expected = voc07
    out = tmp_path / "out"
    result = run_script(
        SCRIPT, "--data_source_dir", str(root), "--output_dir", str(out), "--generate_json", "1"
    )
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == sorted(
        f"{p}_{k}" for p in ("train", "test") for k in ("images.npy", "labels.npy", "targets.json")
    )
    _check(out, "train", expected["trainval"], root)
    _check(out, "test", expected["test"], root)
    # the difficult-only classes are there as -1, and present ones as 1
    test_labels = np.load(out / "test_labels.npy")
    assert (test_labels == -1).any() and (test_labels == 1).any()
    targets = json.loads((out / "test_targets.json").read_text())
    first = sorted(expected["test"])[0]
    assert targets[first] == dict(zip(CLASSES, expected["test"][first].tolist(), strict=True))

    # read back by vissl's disk_filelist sources, through a config
    _, cfg = hydra_compose_and_validate(
        [
            "config=quick_start",
            "config.DATA.TEST.DATA_SOURCES=[disk_filelist]",
            f"config.DATA.TEST.DATA_PATHS=[{out / 'test_images.npy'}]",
            "config.DATA.TEST.LABEL_SOURCES=[disk_filelist]",
            f"config.DATA.TEST.LABEL_PATHS=[{out / 'test_labels.npy'}]",
            "config.DATA.TEST.TRANSFORMS=[{name:ToTensor}]",
        ]
    )
    cfg.DATA.NUM_DATALOADER_WORKERS = 0
    dataset = build_dataset(AttrDict(cfg), "TEST")
    sample = dataset[2]
    assert tuple(sample["data"][0].shape) == (3, 16, 16)
    assert sample["label"][0].tolist() == expected["test"][sorted(expected["test"])[2]].tolist()


def test_annotations_give_the_same_targets(tmp_path: Path, voc07) -> None:
    root, expected = voc07
    from_sets = voc.create_voc_data_files(str(root), str(tmp_path / "a"))
    from_xml = voc.create_voc_data_files(str(root), str(tmp_path / "b"), labels_from="annotations")
    assert set(from_sets) == set(from_xml) == {"train", "test"}
    for partition in ("train", "test"):
        a = np.load(tmp_path / "a" / f"{partition}_labels.npy")
        b = np.load(tmp_path / "b" / f"{partition}_labels.npy")
        assert np.array_equal(a, b)
    _check(tmp_path / "b", "train", expected["trainval"], root)


def test_separate_partitions_and_voc2012_layout(tmp_path: Path) -> None:
    root = tmp_path / "VOC2007"
    expected = make_fake_voc(root, {"train": 4, "val": 3, "test": 2}, seed=1)
    written = voc.create_voc_data_files(str(root), str(tmp_path / "sep"), separate_partitions=True)
    assert {p: n for p, (_, _, n) in written.items()} == {"train": 4, "val": 3, "test": 2}
    _check(tmp_path / "sep", "val", expected["val"], root)
    # VOC2012 has no test files: train and val become the train and test partitions
    root12 = tmp_path / "VOC2012"
    expected12 = make_fake_voc(root12, {"train": 3, "val": 4}, seed=2)
    for name in os.listdir(root12 / "ImageSets" / "Main"):
        if name.endswith("_trainval.txt") or name == "trainval.txt":
            os.remove(root12 / "ImageSets" / "Main" / name)
    voc.create_voc_data_files(str(root12), str(tmp_path / "v12"))
    _check(tmp_path / "v12", "train", expected12["train"], root12)
    _check(tmp_path / "v12", "test", expected12["val"], root12)


def test_user_errors(tmp_path: Path, voc07) -> None:
    root, expected = voc07
    result = run_script(SCRIPT, "--data_source_dir", str(tmp_path), "--output_dir", "x")
    assert_one_line_error(result.returncode, result.stderr, "ImageSets/Main does not exist")
    os.remove(root / "JPEGImages" / f"{sorted(expected['test'])[0]}.jpg")
    result = run_script(SCRIPT, "--data_source_dir", str(root), "--output_dir", str(tmp_path / "o"))
    assert_one_line_error(result.returncode, result.stderr, "1 image(s) of split 'test'")

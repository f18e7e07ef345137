"""extra_scripts/create_disk_filelist.py: image folder -> the disk_filelist .npy files.

The files are read back through vissl's ``disk_filelist`` data and label sources (paths
given directly, and by name through a dataset catalog), and compared with ``disk_folder``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.extra_scripts._helpers import (
    assert_one_line_error,
    import_script,
    run_as_main,
    run_script,
    script_error,
)
from vissl.config.attr_dict import AttrDict
from vissl.data import build_dataset
from vissl.data.dataset_catalog import VisslDatasetCatalog
from vissl.utils.hydra_config import hydra_compose_and_validate

filelist = import_script("create_disk_filelist")
SCRIPT = "create_disk_filelist"


def write_png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((4, 4, 3), value, dtype=np.uint8)).save(path)


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """ROOT/train/{cat,dog,eel} (cat has a nested folder) and ROOT/val/{dog,eel}: val
    lacks cat, so its own ImageFolder numbering would differ from train's."""
    root = tmp_path / "pets"
    value = 10
    for split, classes in (("train", ("cat", "dog", "eel")), ("val", ("dog", "eel"))):
        for cls in classes:
            for i in range(2):
                write_png(root / split / cls / f"{i}.png", value)
                value += 10
    write_png(root / "train" / "cat" / "more" / "2.png", value)
    (root / "train" / "dog" / "notes.txt").write_text("not an image")
    return root


def split_config(split: str, **keys: object) -> AttrDict:
    """The tiny_supervised config with DATA.<split> reading ``disk_filelist``."""
    overrides = [f"config.DATA.{split}.{k}={v}" for k, v in keys.items()]
    return hydra_compose_and_validate(
        [
            "config=test/cpu_test/tiny_supervised",
            f"config.DATA.{split}.DATA_SOURCES=[disk_filelist]",
            f"config.DATA.{split}.LABEL_SOURCES=[disk_filelist]",
            f"config.DATA.{split}.DATA_LIMIT=-1",
            f"config.DATA.{split}.TRANSFORMS=[]",
            *overrides,
        ]
    )[1]


def test_filelists_load_in_vissl_with_the_folder_labels(image_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "lists"
    catalog = tmp_path / "catalog.json"
    proc = run_script(
        SCRIPT, str(image_tree), str(out), "--name", "pets_test", "--catalog", str(catalog)
    )
    assert proc.returncode == 0, proc.stderr
    assert "train: 7 images of 3 classes" in proc.stdout
    assert "val: 4 images of 2 classes" in proc.stdout
    assert "warning: split 'val' has no images of 1 class(es): ['cat']" in proc.stderr
    assert json.loads((out / "classes.json").read_text()) == ["cat", "dog", "eel"]

    images = np.load(out / "train_images.npy", mmap_mode="r")  # str arrays memory-map
    assert images.dtype.kind == "U" and len(images) == 7
    labels = np.load(out / "train_labels.npy")
    assert labels.dtype == np.int64
    assert labels.tolist() == [0, 0, 0, 1, 1, 2, 2]  # cat/more/2.png is a cat; notes.txt skipped

    # TRAIN through explicit paths: the same images and labels as disk_folder
    cfg = split_config(
        "TRAIN",
        DATA_PATHS=f"[{out / 'train_images.npy'}]",
        LABEL_PATHS=f"[{out / 'train_labels.npy'}]",
    )
    from_list = build_dataset(cfg, "TRAIN")
    folder_cfg = split_config(
        "TRAIN",
        DATA_SOURCES="[disk_folder]",
        LABEL_SOURCES="[disk_folder]",
        DATA_PATHS=f"[{image_tree / 'train'}]",
    )
    from_folder = build_dataset(folder_cfg, "TRAIN")
    assert len(from_list) == len(from_folder) == 7
    for i in range(7):
        a, b = from_list[i], from_folder[i]
        assert a["label"] == b["label"]
        assert a["data_valid"] == [1]
        assert np.array_equal(np.asarray(a["data"][0]), np.asarray(b["data"][0]))

    # TEST by name through the catalog entry: val, with train's numbering (dog = 1)
    entry = json.loads(catalog.read_text())["pets_test"]
    assert set(entry) == {"train", "val"}
    VisslDatasetCatalog.register_json(str(catalog))
    try:
        test_set = build_dataset(split_config("TEST", DATASET_NAMES="[pets_test]"), "TEST")
        assert [test_set[i]["label"] for i in range(len(test_set))] == [[1], [1], [2], [2]]
        first = np.asarray(test_set[0]["data"][0])
        expected = np.asarray(Image.open(image_tree / "val" / "dog" / "0.png").convert("RGB"))
        assert np.array_equal(first, expected)
    finally:
        VisslDatasetCatalog.remove("pets_test")


def test_one_split_folder_and_catalog_update(image_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "lists"
    catalog = tmp_path / "catalog.json"
    catalog.write_text(json.dumps({"other": {"train": ["/x.npy", "/y.npy"]}}))
    args = [str(image_tree / "val"), str(out), "--split", "val"]
    args += ["--name", "v", "--catalog", str(catalog)]
    assert filelist.main(args) == 0
    data = json.loads(catalog.read_text())
    assert set(data) == {"other", "v"} and set(data["v"]) == {"val"}
    assert np.load(out / "val_labels.npy").tolist() == [0, 0, 1, 1]  # classes dog, eel only
    # the same name again needs --force
    error = script_error(filelist.main, *args)
    assert "already has a dataset 'v'" in error and "--force" in error
    assert filelist.main([*args, "--force"]) == 0


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("missing", "is not a folder"),
        ("empty", "has no sub-folders"),
        ("mixed", "mixes split folders"),
        ("no_images", "holds no images"),
        ("out_inside", "is inside the image folder"),
    ],
)
def test_bad_folders_give_one_line_errors(tmp_path: Path, layout: str, message: str) -> None:
    root = tmp_path / "root"
    if layout != "missing":
        root.mkdir()
    if layout == "mixed":
        write_png(root / "train" / "a" / "0.png", 1)
        write_png(root / "birds" / "0.png", 1)
    if layout == "no_images":
        (root / "a").mkdir()
        (root / "a" / "readme.txt").write_text("x")
    out = tmp_path / "out"
    if layout == "out_inside":
        write_png(root / "a" / "0.png", 1)
        out = root / "lists"
    assert message in script_error(filelist.main, str(root), str(out))


def test_main_block_error_is_one_line(tmp_path: Path) -> None:
    code, _, err = run_as_main(SCRIPT, str(tmp_path / "nowhere"), str(tmp_path / "out"))
    assert_one_line_error(code, err, "nowhere", "is not a folder")


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        filelist.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for fragment in ("disk_filelist", "examples:", "--catalog", "LABEL_PATHS", "_labels.npy"):
        assert fragment in text

"""``torchvision_dataset``: tiny files in each dataset's real on-disk format, read from disk.

torchvision checks the md5 of the CIFAR, STL10 and SVHN files against the originals; the
tests write their own files and point the class's md5 table at them (the check stays on).
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torchvision.datasets import CIFAR10, CIFAR100, STL10, SVHN

from vissl.data import build_dataset
from vissl.data.data_sources import get_data_source
from vissl.data.data_sources.torchvision_dataset import TorchvisionDataset
from vissl.data.dataset_catalog import CATALOG_ENV, VisslDatasetCatalog
from vissl.errors import ConfigError


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def colors(n: int, offset: int = 0) -> np.ndarray:
    """``n`` distinct RGB colours, one per image."""
    i = np.arange(n)[:, None] + offset
    return np.concatenate([20 * i + 5, 30 * i + 7, 250 - 10 * i], axis=1).astype(np.uint8)


def solid(n: int, size: int, offset: int = 0) -> np.ndarray:
    """``n`` solid ``size`` x ``size`` RGB images, HWC uint8."""
    return np.broadcast_to(colors(n, offset)[:, None, None, :], (n, size, size, 3)).copy()


def dump(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f)
    return path


# ---------------------------------------------------------------- writers of each format
def write_cifar10(root: Path, monkeypatch) -> dict[str, Any]:
    """``cifar-10-batches-py``: one image per train batch (5), 2 in test_batch."""
    folder = root / "cifar-10-batches-py"
    train_labels = [3, 1, 4, 1, 5]
    train_list = []
    for b in range(5):
        rows = solid(1, 32, offset=b).transpose(0, 3, 1, 2).reshape(1, -1)
        path = dump(folder / f"data_batch_{b + 1}", {"data": rows, "labels": [train_labels[b]]})
        train_list.append([path.name, md5(path)])
    rows = solid(2, 32, offset=7).transpose(0, 3, 1, 2).reshape(2, -1)
    test = dump(folder / "test_batch", {"data": rows, "labels": [9, 2]})
    meta = dump(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    monkeypatch.setattr(CIFAR10, "train_list", train_list)
    monkeypatch.setattr(CIFAR10, "test_list", [[test.name, md5(test)]])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": md5(meta)})
    return {"size": (32, 32), "mode": "RGB", "train": train_labels, "test": [9, 2], "offset": 7}


def write_cifar100(root: Path, monkeypatch) -> dict[str, Any]:
    folder = root / "cifar-100-python"
    rows = solid(4, 32).transpose(0, 3, 1, 2).reshape(4, -1)
    train = dump(
        folder / "train", {"data": rows, "fine_labels": [99, 0, 42, 7], "coarse_labels": [0] * 4}
    )
    rows = solid(2, 32, offset=7).transpose(0, 3, 1, 2).reshape(2, -1)
    test = dump(folder / "test", {"data": rows, "fine_labels": [13, 57], "coarse_labels": [1, 2]})
    meta = dump(folder / "meta", {"fine_label_names": [f"f{i}" for i in range(100)]})
    monkeypatch.setattr(CIFAR100, "train_list", [[train.name, md5(train)]])
    monkeypatch.setattr(CIFAR100, "test_list", [[test.name, md5(test)]])
    monkeypatch.setattr(CIFAR100, "meta", {**CIFAR100.meta, "md5": md5(meta)})
    return {"size": (32, 32), "mode": "RGB", "train": [99, 0, 42, 7], "test": [13, 57], "offset": 7}


def _idx(path: Path, array: np.ndarray) -> None:
    """The uncompressed big-endian idx format of MNIST (uint8 data)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (0x0800 + array.ndim).to_bytes(4, "big")
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, monkeypatch) -> dict[str, Any]:
    raw = root / "MNIST" / "raw"
    gray = colors(6)[:, 0]
    _idx(raw / "train-images-idx3-ubyte", np.broadcast_to(gray[:4, None, None], (4, 28, 28)))
    _idx(raw / "train-labels-idx1-ubyte", np.array([5, 0, 4, 1]))
    _idx(raw / "t10k-images-idx3-ubyte", np.broadcast_to(gray[4:, None, None], (2, 28, 28)))
    _idx(raw / "t10k-labels-idx1-ubyte", np.array([7, 2]))
    return {"size": (28, 28), "mode": "L", "train": [5, 0, 4, 1], "test": [7, 2], "offset": 4}


def write_svhn(root: Path, monkeypatch) -> dict[str, Any]:
    sio = pytest.importorskip("scipy.io")
    root.mkdir(parents=True, exist_ok=True)
    for split, images, labels in (
        ("train", solid(4, 32), [10, 1, 2, 9]),  # SVHN stores the digit 0 as 10
        ("test", solid(2, 32, offset=7), [3, 10]),
    ):
        path = root / f"{split}_32x32.mat"
        x = images.transpose(1, 2, 3, 0)  # (32, 32, 3, N), as in the original files
        sio.savemat(path, {"X": x, "y": np.array(labels, dtype=np.uint8)[:, None]})
        url, name, _ = SVHN.split_list[split]
        monkeypatch.setitem(SVHN.split_list, split, [url, name, md5(path)])
    return {"size": (32, 32), "mode": "RGB", "train": [0, 1, 2, 9], "test": [3, 0], "offset": 7}


def write_stl10(root: Path, monkeypatch) -> dict[str, Any]:
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)

    def images(path: Path, n: int, offset: int) -> None:
        # column-major 3x96x96 per image, as in the original binary files
        solid(n, 96, offset).transpose(0, 3, 2, 1).tofile(path)

    images(folder / "train_X.bin", 4, 0)
    np.array([1, 10, 3, 4], dtype=np.uint8).tofile(folder / "train_y.bin")  # 1-based
    images(folder / "unlabeled_X.bin", 3, 20)
    images(folder / "test_X.bin", 2, 7)
    np.array([2, 6], dtype=np.uint8).tofile(folder / "test_y.bin")
    (folder / "class_names.txt").write_text("\n".join(f"k{i}" for i in range(10)))
    (folder / "fold_indices.txt").write_text("0 1\n" * 10)
    table = {name: [name, md5(folder / name)] for name, _ in STL10.train_list + STL10.test_list}
    monkeypatch.setattr(STL10, "train_list", [table[n] for n, _ in STL10.train_list])
    monkeypatch.setattr(STL10, "test_list", [table[n] for n, _ in STL10.test_list])
    return {"size": (96, 96), "mode": "RGB", "train": [0, 9, 2, 3], "test": [1, 5], "offset": 7}


WRITERS = {
    "CIFAR10": write_cifar10,
    "CIFAR100": write_cifar100,
    "MNIST": write_mnist,
    "SVHN": write_svhn,
    "STL10": write_stl10,
}
#: File removed by the missing-file test, relative to the dataset folder.
A_FILE = {
    "CIFAR10": "cifar-10-batches-py/test_batch",
    "CIFAR100": "cifar-100-python/meta",
    "MNIST": "MNIST/raw/t10k-labels-idx1-ubyte",
    "SVHN": "train_32x32.mat",
    "STL10": "stl10_binary/unlabeled_X.bin",
}


def make_source(cfg_factory, root: Path, name: str, split: str) -> TorchvisionDataset:
    return get_data_source("torchvision_dataset")(
        cfg=cfg_factory(),
        path=str(root),
        split=split,
        dataset_name=name,
        data_source="torchvision_dataset",
    )


def expected_pixel(info: dict[str, Any], split: str, i: int) -> tuple[int, ...]:
    rgb = colors(1, offset=i + (info["offset"] if split == "TEST" else 0))[0]
    if info["mode"] == "L":  # MNIST: the gray level copied to three channels
        return (int(rgb[0]),) * 3
    return tuple(int(c) for c in rgb)


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("name", list(WRITERS))
def test_reads_each_format_through_the_source(cfg_factory, tmp_path, monkeypatch, name):
    info = WRITERS[name](tmp_path / name, monkeypatch)
    for split in ("TRAIN", "TEST"):
        source = make_source(cfg_factory, tmp_path / name, name, split)
        labels = info["train" if split == "TRAIN" else "test"]
        assert len(source) == len(labels)
        assert source.get_labels().tolist() == labels
        assert source.get_labels().dtype == np.int64
        for i in range(len(source)):
            image, ok = source[i]
            assert ok is True
            assert image.mode == "RGB" and image.size == info["size"]
            corner = image.getpixel((info["size"][0] - 1, 0))
            assert image.getpixel((0, 0)) == corner == expected_pixel(info, split, i)


@pytest.mark.parametrize("name", list(WRITERS))
def test_reads_each_format_through_the_dataset(cfg_factory, tmp_path, monkeypatch, name):
    info = WRITERS[name](tmp_path / name, monkeypatch)
    split_cfg = {
        "DATA_SOURCES": ["torchvision_dataset"],
        "DATA_PATHS": [str(tmp_path / name)],
        "DATASET_NAMES": [name],
    }
    cfg = cfg_factory(
        train={**split_cfg, "LABEL_SOURCES": ["torchvision_dataset"]},
        test={**split_cfg, "TRANSFORMS": [{"name": "ToTensor"}]},
    )
    train, test = build_dataset(cfg, "TRAIN"), build_dataset(cfg, "TEST")
    assert [train[i]["label"] for i in range(len(train))] == [[x] for x in info["train"]]
    assert train.get_labels().tolist() == info["train"]
    image = train[1]["data"][0]
    assert image.mode == "RGB" and image.size == info["size"]
    tensor = test[1]["data"][0]
    assert tuple(tensor.shape) == (3, info["size"][1], info["size"][0])
    assert test[1]["label"] == [info["test"][1]] and test[1]["data_valid"] == [1]


def test_stl10_unlabeled_splits(cfg_factory, tmp_path, monkeypatch):
    write_stl10(tmp_path, monkeypatch)
    unlabeled = make_source(cfg_factory, tmp_path, "STL10_unlabeled", "TRAIN")
    assert len(unlabeled) == 3 and unlabeled.get_labels().tolist() == [-1, -1, -1]
    assert unlabeled[0][0].getpixel((0, 0)) == tuple(int(c) for c in colors(1, 20)[0])
    both = make_source(cfg_factory, tmp_path, "STL10_train+unlabeled", "TRAIN")
    assert both.get_labels().tolist() == [0, 9, 2, 3, -1, -1, -1]
    with pytest.raises(ConfigError, match=r"'STL10_unlabeled' has no TEST split") as info:
        make_source(cfg_factory, tmp_path, "STL10_unlabeled", "TEST")
    assert info.value.key_path == "config.DATA.TEST.DATASET_NAMES"


@pytest.mark.parametrize("name", list(WRITERS))
def test_missing_file_is_config_error_listing_expected_files(
    cfg_factory, tmp_path, monkeypatch, name
):
    WRITERS[name](tmp_path, monkeypatch)
    (tmp_path / A_FILE[name]).unlink()
    with pytest.raises(ConfigError) as info:
        make_source(cfg_factory, tmp_path, name, "TRAIN")
    message = str(info.value)
    assert info.value.key_path == "config.DATA.TRAIN.DATA_PATHS"
    assert f"is missing {tmp_path / A_FILE[name]}" in message
    assert "expects under that folder: " in message and A_FILE[name] in message
    assert str(tmp_path) in message and "Nothing is downloaded" in message


def test_md5_mismatch_is_config_error(cfg_factory, tmp_path, monkeypatch):
    write_cifar10(tmp_path, monkeypatch)
    monkeypatch.undo()  # the original md5 table: the tiny files are not the originals
    with pytest.raises(ConfigError, match=r"fail torchvision's md5 check.*data_batch_1"):
        make_source(cfg_factory, tmp_path, "CIFAR10", "TRAIN")


def test_unreadable_file_is_config_error(cfg_factory, tmp_path, monkeypatch):
    write_mnist(tmp_path, monkeypatch)
    (tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte").write_bytes(b"\x00\x00")
    with pytest.raises(ConfigError, match="could not be read by torchvision"):
        make_source(cfg_factory, tmp_path, "MNIST", "TRAIN")


def test_unknown_name_and_missing_folder(cfg_factory, tmp_path):
    with pytest.raises(
        ConfigError, match=r"one of \['CIFAR10'.*got 'cifar10'\. Did you mean 'CIFAR10'"
    ) as info:
        make_source(cfg_factory, tmp_path, "cifar10", "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.DATASET_NAMES"
    with pytest.raises(ConfigError, match=r"directory .*nowhere.* does not exist") as info:
        make_source(cfg_factory, tmp_path / "nowhere", "MNIST", "TEST")
    assert info.value.key_path == "config.DATA.TEST.DATA_PATHS"
    # without DATASET_NAMES the source does not know which dataset to read
    cfg = cfg_factory(
        train={"DATA_SOURCES": ["torchvision_dataset"], "DATA_PATHS": [str(tmp_path)]}
    )
    with pytest.raises(ConfigError, match="got 'torchvision_dataset'"):
        build_dataset(cfg, "TRAIN")


def test_folder_from_the_dataset_catalog(cfg_factory, tmp_path, monkeypatch):
    write_mnist(tmp_path / "mnist", monkeypatch)
    monkeypatch.delenv(CATALOG_ENV, raising=False)
    monkeypatch.setattr(VisslDatasetCatalog, "_datasets", {})
    monkeypatch.setattr(VisslDatasetCatalog, "_defaults_loaded", True)  # skip the default file
    VisslDatasetCatalog.register_dict(
        {
            "MNIST": {
                "train": [str(tmp_path / "mnist"), "<unused>"],
                "val": [str(tmp_path / "mnist"), ""],
            }
        }
    )
    split_cfg = {"DATA_SOURCES": ["torchvision_dataset"], "DATASET_NAMES": ["MNIST"]}
    cfg = cfg_factory(train=split_cfg, test=split_cfg)
    assert build_dataset(cfg, "TRAIN").get_labels().tolist() == [5, 0, 4, 1]
    test = build_dataset(cfg, "TEST")
    assert test.paths_from_catalog and [test[i]["label"] for i in range(2)] == [[7], [2]]
    # a missing file under the catalog's folder says where the folder came from
    (tmp_path / "mnist" / "MNIST" / "raw" / "t10k-images-idx3-ubyte").unlink()
    with pytest.raises(ConfigError, match=r"is missing .*comes from the dataset catalog entry"):
        build_dataset(cfg, "TEST")

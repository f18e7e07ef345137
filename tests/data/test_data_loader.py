"""get_loader: distributed sharding, shuffling, workers and reproducible augmentation."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from vissl.data import build_dataset, get_loader
from vissl.errors import ConfigError

DIGITS = {"DATA_SOURCES": ["digits"], "TRANSFORMS": [{"name": "ToTensor"}]}
AUGMENT = [
    {"name": "ImgReplicatePil", "num_times": 2},
    {"name": "RandomResizedCrop", "size": 6},
    {"name": "ImgPilColorDistortion", "strength": 0.5},
    {"name": "ImgPilGaussianBlur", "p": 0.5},
    {"name": "ToTensor"},
]


def _loader(cfg, split="TRAIN", **kwargs):
    params = {"num_replicas": 1, "rank": 0, "seed": 0, "device_is_cuda": False, **kwargs}
    return get_loader(build_dataset(cfg, split), cfg, split, **params)


def _indices(loader) -> list[int]:
    return [i for batch in loader for i in batch["data_idx"][0].tolist()]


def test_sampler_shards_over_two_replicas(cfg_factory):
    cfg = cfg_factory(
        train={**DIGITS, "DATA_LIMIT": 20, "BATCHSIZE_PER_REPLICA": 4},
        test={**DIGITS, "DATA_LIMIT": 20, "BATCHSIZE_PER_REPLICA": 4},
    )
    for split in ("TRAIN", "TEST"):
        shards = [_indices(_loader(cfg, split, num_replicas=2, rank=r)) for r in range(2)]
        assert len(shards[0]) == len(shards[1]) == 10
        assert sorted(shards[0] + shards[1]) == list(range(20))
    test_shard = _indices(_loader(cfg, "TEST", num_replicas=2, rank=0))
    assert test_shard == list(range(0, 20, 2))  # TEST is not shuffled


def test_train_shuffle_depends_on_seed_and_epoch(cfg_factory):
    cfg = cfg_factory(train={**DIGITS, "DATA_LIMIT": 32, "BATCHSIZE_PER_REPLICA": 8})
    loader = _loader(cfg)
    epoch0 = _indices(loader)
    assert epoch0 != list(range(32)) and sorted(epoch0) == list(range(32))
    assert epoch0 == _indices(_loader(cfg))
    assert epoch0 != _indices(_loader(cfg, seed=1))
    loader.sampler.set_epoch(1)
    assert _indices(loader) != epoch0


def test_batch_size_drop_last_and_collator(cfg_factory):
    cfg = cfg_factory(
        train={
            "DATA_SOURCES": ["digits"],
            "DATA_LIMIT": 10,
            "BATCHSIZE_PER_REPLICA": 4,
            "DROP_LAST": True,
            "LABEL_TYPE": "sample_index",
            "TRANSFORMS": [{"name": "ImgReplicatePil"}, {"name": "ToTensor"}],
            "COLLATE_FUNCTION": "simclr_collator",
        },
        DATA={"PIN_MEMORY": True},
    )
    loader = _loader(cfg)
    assert len(loader) == 2 and not loader.pin_memory
    batch = next(iter(loader))
    assert batch["data"][0].shape == (8, 3, 8, 8)
    idx = batch["data_idx"][0].tolist()
    assert idx[:4] == idx[4:] and batch["label"][0].tolist() == idx


def test_two_workers_reproducible_augmentations(cfg_factory):
    cfg = cfg_factory(
        train={
            "DATA_SOURCES": ["synthetic"],
            "DEFAULT_GRAY_IMG_SIZE": 8,
            "DATA_LIMIT": 16,
            "BATCHSIZE_PER_REPLICA": 4,
            "TRANSFORMS": AUGMENT,
            "COLLATE_FUNCTION": "simclr_collator",
        },
        DATA={"NUM_DATALOADER_WORKERS": 2},
        MULTI_PROCESSING_METHOD="forkserver",
    )

    def run(seed: int) -> list[torch.Tensor]:
        loader = _loader(cfg, seed=seed)
        assert loader.num_workers == 2 and loader.persistent_workers
        first = [b["data"][0] for b in loader]
        loader.sampler.set_epoch(1)
        second = [b["data"][0] for b in loader]  # workers persist, RNG streams go on
        return first + second

    a, b = run(0), run(0)
    assert len(a) == 8
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    # the two views of a sample are augmented differently
    assert not torch.equal(a[0][:4], a[0][4:])
    c = run(1)
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_workers_see_the_same_synthetic_images_as_the_main_process(cfg_factory):
    cfg = cfg_factory(
        test={
            "DATA_SOURCES": ["synthetic"],
            "DEFAULT_GRAY_IMG_SIZE": 4,
            "DATA_LIMIT": 6,
            "BATCHSIZE_PER_REPLICA": 3,
            "TRANSFORMS": [{"name": "ToTensor"}],
        },
        DATA={"NUM_DATALOADER_WORKERS": 2},
        MULTI_PROCESSING_METHOD="forkserver",
    )
    dataset = build_dataset(cfg, "TEST")
    loader = get_loader(dataset, cfg, "TEST", num_replicas=1, rank=0, seed=0, device_is_cuda=False)
    batches = list(loader)
    expected = torch.stack([dataset[i]["data"][0] for i in range(6)])
    assert torch.equal(torch.cat([b["data"][0] for b in batches]), expected)


def test_multicrop_end_to_end(cfg_factory):
    cfg = cfg_factory(
        train={
            "DATA_SOURCES": ["digits"],
            "DATA_LIMIT": 4,
            "BATCHSIZE_PER_REPLICA": 2,
            "TRANSFORMS": [
                {
                    "name": "ImgPilToMultiCrop",
                    "total_num_crops": 3,
                    "size_crops": [8, 4],
                    "num_crops": [1, 2],
                    "crop_scales": [[0.5, 1.0], [0.2, 0.5]],
                },
                {"name": "ToTensor"},
            ],
            "COLLATE_FUNCTION": "multicrop_collator",
        }
    )
    batch = next(iter(_loader(cfg)))
    assert [tuple(t.shape) for t in batch["data"][0]] == [(2, 3, 8, 8), (2, 3, 4, 4), (2, 3, 4, 4)]
    assert batch["label"][0].shape == (6,)


def test_loader_config_errors(cfg_factory):
    base = {"DATA_SOURCES": ["digits"], "DATA_LIMIT": 4}
    with pytest.raises(ConfigError) as info:
        _loader(cfg_factory(train={**base, "BATCHSIZE_PER_REPLICA": 0}))
    assert info.value.key_path == "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA"
    bad_method = cfg_factory(
        train=base, DATA={"NUM_DATALOADER_WORKERS": 1}, MULTI_PROCESSING_METHOD="threads"
    )
    with pytest.raises(ConfigError) as info:
        _loader(bad_method)
    assert info.value.key_path == "config.MULTI_PROCESSING_METHOD"


def test_dataset_pickles_without_loaded_filelist(cfg_factory, tmp_path, png_writer):
    np.save(tmp_path / "f.npy", np.array([str(png_writer(tmp_path / "a.png", (9, 9, 9)))]))
    cfg = cfg_factory(
        train={"DATA_SOURCES": ["disk_filelist"], "DATA_PATHS": [str(tmp_path / "f.npy")]}
    )
    dataset = build_dataset(cfg, "TRAIN")
    dataset[0]
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone.data_objs[0]._files is None
    assert clone[0]["data"][0].getpixel((0, 0)) == (9, 9, 9)

"""Transforms: torchvision fallback, VISSL's SSL transforms, the indices rule, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

from vissl.data import build_dataset, build_transforms, get_transform
from vissl.data.ssl_transforms import SSLTransformsWrapper
from vissl.errors import ConfigError, UnknownNameError


def _img(value: int = 100, size: int = 8) -> Image.Image:
    rng = np.random.default_rng(value)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def _sample(n: int = 1) -> dict:
    return {
        "data": [_img(i) for i in range(n)],
        "label": [10 + i for i in range(n)],
        "data_valid": [1] * n,
        "data_idx": [5] * n,
    }


def test_torchvision_fallback_by_name_and_snake_case():
    assert get_transform("RandomResizedCrop") is T.RandomResizedCrop
    assert get_transform("random_horizontal_flip") is T.RandomHorizontalFlip
    compose = build_transforms([{"name": "Resize", "size": 4}, {"name": "ToTensor"}])
    out = compose(_sample())
    assert out["data"][0].shape == (3, 4, 4)


def test_unknown_transform_lists_names_and_key():
    with pytest.raises(UnknownNameError) as info:
        build_transforms([{"name": "ToTensor"}, {"name": "ImgReplicatePill"}], "TEST")
    message = str(info.value)
    assert "config.DATA.TEST.TRANSFORMS[1].name" in message
    assert "ImgReplicatePil" in message and "torchvision" in message


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "RandomResizedCrop", "sise": 4},
        {"name": "ImgReplicatePil", "num_times": 0},
        {
            "name": "ImgPilToMultiCrop",
            "total_num_crops": 3,
            "size_crops": [4],
            "num_crops": [2],
            "crop_scales": [[0.5, 1]],
        },
        {"name": "ImgPilRandomSolarize", "p": 2.0},
        {"name": "ImgPilColorDistortion", "strength": 5.0},
    ],
)
def test_bad_kwargs_name_the_entry(entry):
    with pytest.raises(ConfigError) as info:
        build_transforms([{"name": "ToTensor"}, entry], "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.TRANSFORMS[1]"
    assert entry["name"] in str(info.value)


def test_entry_without_name_is_config_error():
    with pytest.raises(ConfigError, match=r"TRANSFORMS\[0\] has no 'name'"):
        build_transforms([{"p": 0.5}])


def test_indices_rule_applies_only_to_listed_entries():
    flip = build_transforms([{"name": "RandomHorizontalFlip", "p": 1.0, "indices": [1]}])
    sample = _sample(2)
    originals = [np.asarray(x).copy() for x in sample["data"]]
    out = flip(sample)
    assert np.array_equal(np.asarray(out["data"][0]), originals[0])
    assert np.array_equal(np.asarray(out["data"][1]), originals[1][:, ::-1])
    both = build_transforms([{"name": "RandomHorizontalFlip", "p": 1.0}])(_sample(2))
    assert np.array_equal(np.asarray(both["data"][0]), originals[0][:, ::-1])


def test_indices_out_of_range_is_config_error():
    compose = build_transforms([{"name": "ToTensor", "indices": [3]}])
    with pytest.raises(ConfigError, match=r"TRANSFORMS\[0\]\.indices"):
        compose(_sample(2))
    with pytest.raises(ConfigError, match="indices"):
        build_transforms([{"name": "ToTensor", "indices": ["a"]}])


def test_replicate_flattens_and_replicates_metadata():
    sample = _sample(2)
    sample["data_valid"] = [1, -1]
    out = build_transforms([{"name": "ImgReplicatePil", "num_times": 3}])(sample)
    assert len(out["data"]) == 6
    assert out["label"] == [10, 10, 10, 11, 11, 11]
    assert out["data_valid"] == [1, 1, 1, -1, -1, -1]
    assert out["data_idx"] == [5] * 6
    assert out["data"][0] is not out["data"][1]
    assert np.array_equal(np.asarray(out["data"][4]), np.asarray(_img(1)))


def test_transforms_after_replicate_see_every_copy():
    compose = build_transforms(
        [
            {"name": "ImgReplicatePil", "num_times": 2},
            {"name": "RandomHorizontalFlip", "p": 1.0, "indices": [1]},
        ]
    )
    out = compose(_sample())
    base = np.asarray(_img(0))
    assert np.array_equal(np.asarray(out["data"][0]), base)
    assert np.array_equal(np.asarray(out["data"][1]), base[:, ::-1])


def test_multicrop_shapes_and_order():
    compose = build_transforms(
        [
            {
                "name": "ImgPilToMultiCrop",
                "total_num_crops": 5,
                "size_crops": [8, 4],
                "num_crops": [2, 3],
                "crop_scales": [[0.5, 1.0], [0.1, 0.5]],
            },
            {"name": "ToTensor"},
        ]
    )
    out = compose(_sample())
    assert [tuple(x.shape) for x in out["data"]] == [(3, 8, 8)] * 2 + [(3, 4, 4)] * 3
    assert out["label"] == [10] * 5 and out["data_idx"] == [5] * 5


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "ImgPilColorDistortion", "strength": 1.0},
        {"name": "ImgPilGaussianBlur", "p": 1.0, "radius_min": 0.1, "radius_max": 2.0},
        {"name": "ImgPilRandomSolarize", "p": 1.0},
    ],
)
def test_photometric_transforms_keep_size_and_are_seeded_by_torch(entry):
    compose = build_transforms([entry])
    torch.manual_seed(0)
    first = [np.asarray(compose(_sample())["data"][0]) for _ in range(4)]
    torch.manual_seed(0)
    second = [np.asarray(compose(_sample())["data"][0]) for _ in range(4)]
    assert all(a.shape == (8, 8, 3) for a in first)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_probability_zero_is_identity():
    compose = build_transforms(
        [
            {"name": "ImgPilGaussianBlur", "p": 0.0},
            {"name": "ImgPilRandomSolarize", "p": 0.0},
            {
                "name": "ImgPilColorDistortion",
                "color_jitter_probability": 0.0,
                "grayscale_probability": 0.0,
            },
        ]
    )
    assert np.array_equal(np.asarray(compose(_sample())["data"][0]), np.asarray(_img(0)))


def test_solarize_inverts_bright_pixels():
    transform = get_transform("ImgPilRandomSolarize")(p=1.0)
    img = Image.new("RGB", (2, 2), (255, 255, 255))
    torch.manual_seed(1)
    outputs = {int(np.asarray(transform(img))[0, 0, 0]) for _ in range(10)}
    # every threshold 0..255 inverts white; the threshold 256 leaves it unchanged
    assert 0 in outputs and outputs <= {0, 255}


def test_wrapper_kinds_for_user_transforms():
    class Pair:
        ssl_transform_kind = "labels"

        def __call__(self, img):
            return img, 99

    wrapper = SSLTransformsWrapper(Pair(), "Pair")
    out = wrapper(_sample(2))
    assert out["label"] == [99, 99]
    grouping = SSLTransformsWrapper(lambda imgs: list(reversed(imgs)), "Rev", kind="grouping")
    sample = _sample(2)
    first = sample["data"][0]
    assert grouping(sample)["data"][1] is first


def test_dataset_applies_transforms(cfg_factory):
    cfg = cfg_factory(
        train={
            "DATA_SOURCES": ["digits"],
            "LABEL_TYPE": "sample_index",
            "TRANSFORMS": [{"name": "ImgReplicatePil", "num_times": 2}, {"name": "ToTensor"}],
        }
    )
    sample = build_dataset(cfg, "TRAIN")[4]
    assert [tuple(x.shape) for x in sample["data"]] == [(3, 8, 8)] * 2
    assert sample["label"] == [4, 4] and sample["data_idx"] == [4, 4]

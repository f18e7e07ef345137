"""``ImgPilMultiCropRandomApply``: per-crop-type probabilities, seeding, shapes, key-path errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from vissl.data import build_dataset, build_transforms
from vissl.data.samplers import SampleKey
from vissl.errors import ConfigError, UnknownNameError

MULTICROP = {
    "name": "ImgPilToMultiCrop",
    "total_num_crops": 3,
    "size_crops": [8, 4],
    "num_crops": [1, 2],
    "crop_scales": [[0.5, 1.0], [0.2, 0.5]],
}
INVERT = {"name": "RandomInvert", "p": 1.0}  # deterministic: always inverts


def _apply(prob, transforms=None, **extra):
    return {
        "name": "ImgPilMultiCropRandomApply",
        "transforms": [INVERT] if transforms is None else transforms,
        "prob": prob,
        **{"total_nmb_crops": 3, "nmb_crops": [1, 2], **extra},
    }


def _sample():
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8))
    return {"data": [image], "label": [4], "data_valid": [1], "data_idx": [4]}


def _crops(entries, seed=0):
    torch.manual_seed(seed)
    return [np.asarray(x) for x in build_transforms(entries)(_sample())["data"]]


@pytest.mark.parametrize(
    ("prob", "inverted"),
    [
        ([1.0, 0.0], [True, False, False]),
        ([0.0, 1.0], [False, True, True]),
        ([1.0, 1.0], [True, True, True]),
        ([0.0, 0.0], [False, False, False]),
        (1.0, [True, True, True]),  # one number for every crop type
    ],
)
def test_probability_per_crop_type(prob, inverted):
    reference = _crops([MULTICROP])  # the crops are drawn before the random apply
    out = _crops([MULTICROP, _apply(prob)])
    assert [x.shape for x in out] == [(8, 8, 3), (4, 4, 3), (4, 4, 3)]
    for crop, ref, inv in zip(out, reference, inverted):
        expected = np.asarray(ImageOps.invert(Image.fromarray(ref))) if inv else ref
        assert np.array_equal(crop, expected)


def test_vissl_0_1_6_form_one_probability_per_crop_without_nmb_crops():
    # VISSL 0.1.6's signature (its DINO and Barlow Twins quick configs): transforms and prob
    entry = {"name": "ImgPilMultiCropRandomApply", "transforms": [INVERT], "prob": [0.0, 1.0, 0.0]}
    reference = _crops([MULTICROP])
    out = _crops([MULTICROP, entry])
    for crop, ref, inv in zip(out, reference, [False, True, False]):
        expected = np.asarray(ImageOps.invert(Image.fromarray(ref))) if inv else ref
        assert np.array_equal(crop, expected)
    with pytest.raises(ConfigError) as info:  # 2 probabilities for 3 crops
        build_transforms([MULTICROP, {**entry, "prob": [0.0, 1.0]}])(_sample())
    assert info.value.key_path == "config.DATA.TRAIN.TRANSFORMS[1].total_nmb_crops"
    with pytest.raises(ConfigError) as info:  # one number needs the crop counts
        build_transforms([MULTICROP, {**entry, "prob": 0.5}])
    assert info.value.key_path == "config.DATA.TRAIN.TRANSFORMS[1].nmb_crops"


def test_probability_is_respected_in_frequency():
    transform = build_transforms(
        [_apply([0.25, 0.75], nmb_crops=[100, 100], total_nmb_crops=200)]
    ).transforms[0]
    crops = [Image.new("RGB", (2, 2), (0, 0, 0))] * 200
    torch.manual_seed(0)
    out = transform({"data": list(crops), "label": [0] * 200})["data"]
    applied = [np.asarray(x)[0, 0, 0] == 255 for x in out]
    assert 15 <= sum(applied[:100]) <= 35
    assert 65 <= sum(applied[100:]) <= 85


def test_same_seed_same_crops_and_shapes_after_to_tensor():
    entries = [
        MULTICROP,
        _apply(
            [0.5, 0.5],
            transforms=[
                {"name": "ImgPilRandomSolarize", "p": 1.0},
                {"name": "ImgPilRandomPhotometric", "p": 1.0},
            ],
        ),
        {"name": "ToTensor"},
    ]
    compose = build_transforms(entries)
    torch.manual_seed(3)
    first = [compose(_sample())["data"] for _ in range(5)]
    torch.manual_seed(3)
    second = [compose(_sample())["data"] for _ in range(5)]
    for a, b in zip(first, second):
        assert [tuple(x.shape) for x in a] == [(3, 8, 8), (3, 4, 4), (3, 4, 4)]
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert any(not torch.equal(first[0][0], f[0]) for f in first[1:])


def test_reproducible_per_sample_in_the_dataset_and_metadata_kept(cfg_factory):
    cfg = cfg_factory(
        train={
            "DATA_SOURCES": ["synthetic"],
            "DEFAULT_GRAY_IMG_SIZE": 12,
            "LABEL_TYPE": "sample_index",
            "TRANSFORMS": [
                MULTICROP,
                _apply([0.5, 0.5], transforms=[{"name": "ImgPilRandomSolarize", "p": 1.0}]),
                {"name": "ImgPilToRawTensor"},
            ],
        }
    )
    dataset = build_dataset(cfg, "TRAIN")
    a, b = dataset[SampleKey(2, 1)], dataset[SampleKey(2, 1)]
    assert all(torch.equal(x, y) for x, y in zip(a["data"], b["data"]))
    assert a["label"] == [2, 2, 2] and a["data_idx"] == [2, 2, 2]


BAD = [
    (_apply([1.0]), "prob"),  # one per crop type
    (_apply([1.0, 1.5]), "prob"),
    (_apply("high"), "prob"),
    (_apply([1.0, 0.0], nmb_crops=[1, 0]), "nmb_crops"),
    (_apply([1.0, 0.0], nmb_crops=2), "nmb_crops"),
    (_apply([1.0, 0.0], total_nmb_crops=4), "total_nmb_crops"),
    (_apply([1.0, 0.0], probs=[1.0, 0.0]), "probs"),  # unknown key
    ({"name": "ImgPilMultiCropRandomApply", "prob": [1.0], "nmb_crops": [3]}, "transforms"),
    (_apply([1.0, 0.0], transforms=[]), "transforms"),
    (_apply([1.0, 0.0], transforms=["RandomInvert"]), "transforms[0]"),
    (_apply([1.0, 0.0], transforms=[{"name": "RandomInvert", "q": 1}]), "transforms[0]"),
    (_apply([1.0, 0.0], transforms=[{"name": "ImgReplicatePil"}]), "transforms[0]"),
    (_apply([1.0, 0.0], transforms=[{**INVERT, "indices": [0]}]), "transforms[0]"),
]


@pytest.mark.parametrize(("entry", "key"), BAD)
def test_bad_keys_name_the_key_path(entry, key):
    with pytest.raises(ConfigError) as info:
        build_transforms([MULTICROP, entry], "TRAIN")
    path = f"config.DATA.TRAIN.TRANSFORMS[1].{key}"
    assert info.value.key_path == path
    assert path in str(info.value)


def test_unknown_inner_transform_names_its_key():
    with pytest.raises(UnknownNameError, match=r"TRANSFORMS\[1\]\.transforms\[0\]\.name"):
        build_transforms([MULTICROP, _apply([1.0, 0.0], transforms=[{"name": "Blurr"}])])


def test_crop_count_mismatch_at_run_time():
    compose = build_transforms([_apply([1.0, 0.0])], "TRAIN")  # no multi-crop before it
    with pytest.raises(ConfigError) as info:
        compose(_sample())
    assert info.value.key_path == "config.DATA.TRAIN.TRANSFORMS[0].total_nmb_crops"
    assert "1 data entries" in str(info.value)

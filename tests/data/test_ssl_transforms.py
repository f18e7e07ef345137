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


# --------------------------------------------------------------- ImgPilToRawTensor


def test_raw_tensor_keeps_pixel_values_channels_first():
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    out = build_transforms([{"name": "ImgPilToRawTensor"}])(
        {"data": [Image.fromarray(pixels)], "label": [0]}
    )["data"][0]
    assert out.dtype == torch.float32 and tuple(out.shape) == (3, 6, 8)
    for c in range(3):
        for y in range(6):
            for x in range(8):
                assert out[c, y, x].item() == float(pixels[y, x, c])
    assert out.max().item() > 1.0  # not scaled to [0, 1]
    # the same layout as ToTensor, without the division by 255
    assert torch.allclose(out / 255.0, T.ToTensor()(Image.fromarray(pixels)))


def test_raw_tensor_of_a_gray_image_has_one_channel():
    gray = Image.fromarray(np.arange(12, dtype=np.uint8).reshape(3, 4) * 20, mode="L")
    out = get_transform("ImgPilToRawTensor")()(gray)
    assert tuple(out.shape) == (1, 3, 4)
    assert out[0, 2, 3].item() == 11 * 20


# --------------------------------------------------------- ImgPilRandomPhotometric


def _photo_sample():
    return {"data": [_img(7, size=16)], "label": [0]}


def test_random_photometric_is_reproducible_with_the_same_seed():
    compose = build_transforms([{"name": "ImgPilRandomPhotometric", "p": 0.8}])
    torch.manual_seed(5)
    first = [np.asarray(compose(_photo_sample())["data"][0]) for _ in range(12)]
    torch.manual_seed(5)
    second = [np.asarray(compose(_photo_sample())["data"][0]) for _ in range(12)]
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    assert all(a.shape == (16, 16, 3) and a.dtype == np.uint8 for a in first)
    original = np.asarray(_img(7, size=16))
    assert any(not np.array_equal(a, original) for a in first)


def test_random_photometric_probabilities_and_ops(monkeypatch):
    import vissl.data.ssl_transforms.img_pil_random_photometric as module

    calls: list[tuple[str, float]] = []
    real = module.apply_photometric_op

    def record(image, op, magnitude):
        calls.append((op, magnitude))
        return real(image, op, magnitude)

    monkeypatch.setattr(module, "apply_photometric_op", record)
    never = get_transform("ImgPilRandomPhotometric")(p=0.0)
    img = _img(7, size=16)
    torch.manual_seed(0)
    assert all(never(img) is img for _ in range(50)) and not calls
    always = get_transform("ImgPilRandomPhotometric")(p=1.0)
    torch.manual_seed(0)
    for _ in range(200):
        always(img)
    assert len(calls) == 200
    assert {op for op, _ in calls} == set(module.PHOTOMETRIC_OPS)  # every op is drawn
    assert all(0.0 <= m < 1.0 for _, m in calls)
    default = get_transform("ImgPilRandomPhotometric")()
    assert default.p == 0.8


def test_photometric_ops_against_pil():
    from PIL import ImageEnhance, ImageOps

    from vissl.data.ssl_transforms.img_pil_random_photometric import apply_photometric_op

    img = _img(11, size=16)

    def same(a, b):
        return np.array_equal(np.asarray(a), np.asarray(b))

    # magnitude 0.25 -> enhance factor 0.1 + 1.8 * 0.25 = 0.55
    assert same(
        apply_photometric_op(img, "brightness", 0.25), ImageEnhance.Brightness(img).enhance(0.55)
    )
    assert same(apply_photometric_op(img, "contrast", 0.5), img)  # factor 1: identity
    assert same(apply_photometric_op(img, "posterize", 0.0), ImageOps.posterize(img, 4))
    assert same(apply_photometric_op(img, "posterize", 0.99), img)  # 8 bits
    assert same(apply_photometric_op(img, "solarize", 0.5), ImageOps.solarize(img, 128))
    assert same(apply_photometric_op(img, "solarize", 0.9999), img)  # threshold 256
    assert same(apply_photometric_op(img, "equalize", 0.3), ImageOps.equalize(img))
    assert same(apply_photometric_op(img, "autocontrast", 0.3), ImageOps.autocontrast(img))
    # hue: magnitude 0.75 -> shift 0.05 turn, added to PIL's 8-bit HSV hue channel
    h, s, v = img.convert("HSV").split()
    shifted = (np.asarray(h) + np.uint8(0.05 * 255)).astype(np.uint8)
    hue_ref = Image.merge("HSV", (Image.fromarray(shifted, "L"), s, v)).convert("RGB")
    assert same(apply_photometric_op(img, "hue", 0.75), hue_ref)
    gray = img.convert("L")
    for op in ("brightness", "contrast", "saturation", "hue", "sharpness", "posterize"):
        out = apply_photometric_op(gray, op, 0.7)
        assert out.mode == "L" and out.size == gray.size


@pytest.mark.parametrize("p", [1.5, -0.1, "0.5", True])
def test_random_photometric_bad_p_names_the_entry(p):
    with pytest.raises(ConfigError) as info:
        build_transforms([{"name": "ImgPilRandomPhotometric", "p": p}], "TRAIN")
    assert info.value.key_path == "config.DATA.TRAIN.TRANSFORMS[0]"
    assert "p must be a number in [0, 1]" in str(info.value)


def test_new_transforms_are_reproducible_per_sample_in_the_dataset(cfg_factory):
    from vissl.data.samplers import SampleKey

    cfg = cfg_factory(
        train={
            "DATA_SOURCES": ["synthetic"],
            "DEFAULT_GRAY_IMG_SIZE": 12,
            "LABEL_TYPE": "sample_index",
            "TRANSFORMS": [
                {"name": "ImgReplicatePil", "num_times": 2},
                {"name": "ImgPilRandomPhotometric", "p": 1.0},
                {"name": "ImgPilToRawTensor"},
            ],
        }
    )
    dataset = build_dataset(cfg, "TRAIN")
    a = dataset[SampleKey(3, 0)]["data"]
    b = dataset[SampleKey(3, 0)]["data"]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert tuple(a[0].shape) == (3, 12, 12) and a[0].dtype == torch.float32
    draws = [dataset[SampleKey(3, epoch)]["data"][0] for epoch in range(1, 6)]
    assert any(not torch.equal(a[0], d) for d in draws)  # other epochs draw other ops

"""``RandAugment`` (VISSL's arguments) and ``RandomErasing`` (torchvision's, checked by key).

RandAugment's operations are checked against their definitions written here with numpy
(posterize keeps the top bits, solarize inverts from a threshold, SolarizeAdd adds below
128); its draws (operations, apply-or-not, magnitude noise) are seeded by torch's
generator; every bad argument is a ``ConfigError`` naming its key.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image

from vissl.data.ssl_transforms import get_transform
from vissl.data.ssl_transforms.rand_augment import (
    OPERATIONS,
    RAND_INCREASING_OPS,
    RAND_OPS,
    RandAugment,
    _Geometry,
)
from vissl.data.ssl_transforms.random_erasing import RandomErasing
from vissl.data.ssl_transforms.sample_wrapper import SSLTransformsWrapper
from vissl.errors import ConfigError

KEY = "config.DATA.TRAIN.TRANSFORMS[2]"
GEOMETRY = _Geometry((128, 128, 128), (Image.Resampling.BILINEAR,))


def _image(seed: int = 0, size: tuple[int, int] = (12, 10)) -> Image.Image:
    rng = np.random.RandomState(seed)
    return Image.fromarray(rng.randint(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _entry(name: str, **kwargs: Any) -> SSLTransformsWrapper:
    return SSLTransformsWrapper.from_config({"name": name, **kwargs}, key_path=KEY)


def _apply(op: str, image: Image.Image, level: float) -> np.ndarray:
    return np.asarray(OPERATIONS[op](image, level, GEOMETRY, 0.45))


def test_registered_names_shadow_torchvision() -> None:
    assert get_transform("RandAugment") is RandAugment
    assert get_transform("RandomErasing") is RandomErasing
    assert issubclass(RandomErasing, T.RandomErasing)


def test_pixel_operations_follow_their_definitions() -> None:
    image = _image()
    x = np.asarray(image).astype(np.int64)
    # posterize at level 5: int(4 * 5 / 10) = 2 bits kept
    np.testing.assert_array_equal(_apply("Posterize", image, 5), x & 0b11000000)
    # increasing posterize at level 5: 4 - 2 = 2 bits; at level 0: 4 bits; level 10: 0 bits
    np.testing.assert_array_equal(_apply("PosterizeIncreasing", image, 0), x & 0b11110000)
    np.testing.assert_array_equal(_apply("PosterizeIncreasing", image, 10), 0 * x)
    # solarize at level 5: threshold int(256 * 0.5) = 128, pixels >= 128 inverted
    np.testing.assert_array_equal(_apply("Solarize", image, 5), np.where(x >= 128, 255 - x, x))
    # increasing solarize at level 10: threshold 0, every pixel inverted
    np.testing.assert_array_equal(_apply("SolarizeIncreasing", image, 10), 255 - x)
    # SolarizeAdd at level 10: + 110 below 128, capped at 255
    np.testing.assert_array_equal(
        _apply("SolarizeAdd", image, 10), np.where(x < 128, np.minimum(x + 110, 255), x)
    )
    np.testing.assert_array_equal(_apply("Invert", image, 3), 255 - x)
    # enhance factor 0.1 + 1.8 * 5 / 10 = 1.0 at level 5: brightness unchanged
    np.testing.assert_array_equal(_apply("Brightness", image, 5), x)
    # level 0 geometry is the identity (0 degrees, no shear, no shift)
    for op in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"):
        np.testing.assert_array_equal(_apply(op, image, 0), x)


def test_geometric_operations_move_pixels_by_the_magnitude() -> None:
    image = Image.new("L", (10, 10), 0)
    image.putpixel((5, 3), 255)
    nearest = _Geometry((0, 0, 0), (Image.Resampling.NEAREST,))
    for seed in range(4):
        torch.manual_seed(seed)
        shift = 4.5 * (-1 if torch.rand(()).item() > 0.5 else 1)  # the op's sign draw
        torch.manual_seed(seed)
        # TranslateXRel at level 10, translate_pct 0.45: 4.5 px of a 10 px image; output
        # pixel x samples the input at x + shift (PIL's affine), nearest at pixel centres
        out = np.asarray(OPERATIONS["TranslateXRel"](image, 10, nearest, 0.45))
        ys, xs = np.nonzero(out)
        assert ys.tolist() == [3] and xs.tolist() == [int(5 - shift)]


def test_every_operation_keeps_size_and_mode() -> None:
    for mode in ("RGB", "L"):
        image = _image().convert(mode)
        for op in OPERATIONS:
            for level in (0.0, 4.3, 10.0):
                out = OPERATIONS[op](image, level, GEOMETRY, 0.45)
                assert out.size == image.size and out.mode == mode, op


def test_draws_are_seeded_and_follow_the_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    image = _image(1)
    ra = RandAugment(magnitude=9, magnitude_std=0.5, num_layers=3, increasing_severity=True)
    torch.manual_seed(4)
    a = np.asarray(ra(image))
    torch.manual_seed(4)
    b = np.asarray(ra(image))
    torch.manual_seed(5)
    c = np.asarray(ra(image))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.array_equal(np.asarray(RandAugment(num_layers=0)(image)), np.asarray(image))

    seen: list[tuple[str, float]] = []
    for name in OPERATIONS:
        monkeypatch.setitem(
            OPERATIONS, name, lambda img, lvl, g, p, name=name: seen.append((name, lvl)) or img
        )
    torch.manual_seed(0)
    for _ in range(300):
        ra(image)
    names = {n for n, _ in seen}
    assert names <= set(RAND_INCREASING_OPS) and len(names) == len(RAND_INCREASING_OPS)
    # each of the 3 x 300 drawn operations is applied with probability 0.5
    assert 0.42 < len(seen) / 900 < 0.58
    levels = np.array([lvl for _, lvl in seen])
    assert levels.min() >= 0 and levels.max() <= 10
    assert abs(levels.mean() - 9) < 0.1 and 0.35 < levels.std() < 0.65
    seen.clear()
    for _ in range(50):
        RandAugment(magnitude=3)(image)
    assert {n for n, _ in seen} <= set(RAND_OPS) and {lvl for _, lvl in seen} == {3.0}


def test_weighted_choice_draws_without_replacement(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[list[str]] = []
    ra = RandAugment(num_layers=4, weight_choice=0)
    monkeypatch.setattr(ra, "_draw_ops", lambda orig=ra._draw_ops: drawn.append(orig()) or [])
    torch.manual_seed(0)
    for _ in range(100):
        ra(_image())
    assert all(len(set(d)) == 4 for d in drawn)
    flat = [n for d in drawn for n in d]
    assert "Invert" not in flat and "Posterize" not in flat  # weight 0
    assert flat.count("Rotate") > flat.count("Color")


RA_BAD = [
    ({"magnitude": 11}, "magnitude"),
    ({"magnitude": -1}, "magnitude"),
    ({"magnitude": "9"}, "magnitude"),
    ({"magnitude_std": -0.5}, "magnitude_std"),
    ({"num_layers": 1.5}, "num_layers"),
    ({"num_layers": -1}, "num_layers"),
    ({"increasing_severity": 1}, "increasing_severity"),
    ({"weight_choice": 1}, "weight_choice"),
    ({"weight_choice": 0, "num_layers": 14}, "num_layers"),
    ({"translate_pct": 2}, "translate_pct"),
    ({"img_mean": [1, 2]}, "img_mean"),
    ({"interpolation": "lanczos"}, "interpolation"),
    ({"interpolation": 1}, "interpolation"),
    ({"num_ops": 2}, "num_ops"),
    ({"magnitude_bins": 2}, "magnitude_bins"),
]


@pytest.mark.parametrize(("kwargs", "key"), RA_BAD)
def test_rand_augment_bad_arguments_name_their_key(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        _entry("RandAugment", **kwargs)
    assert err.value.key_path == f"{KEY}.{key}"
    assert f"{KEY}.{key}" in str(err.value)


def test_rand_augment_arguments() -> None:
    ra = _entry("RandAugment", magnitude=9, magnitude_std=0.5, increasing_severity=True).transform
    assert isinstance(ra, RandAugment)
    assert ra.ops == RAND_INCREASING_OPS and ra.num_layers == 2
    assert ra.magnitude == 9 and ra.magnitude_std == 0.5
    custom = _entry(
        "RandAugment", img_mean=7, interpolation=[2, "bicubic"], translate_const=100
    ).transform
    assert custom.geometry.fill == (7, 7, 7)
    assert custom.geometry.interpolations == (
        Image.Resampling.BILINEAR,
        Image.Resampling.BICUBIC,
    )
    with pytest.raises(ConfigError, match="num_layers"):
        _entry("RandAugment", num_ops=2)  # torchvision's name: the hint gives VISSL's
    with pytest.raises(ConfigError, match="before ToTensor") as err:
        ra(torch.zeros(3, 4, 4))
    assert err.value.key_path == KEY


ERASE_BAD = [
    ({"p": 1.5}, "p"),
    ({"scale": [0.4, 0.1]}, "scale"),
    ({"scale": [0.0, 0.5]}, "scale"),
    ({"scale": [0.1, 2.0]}, "scale"),
    ({"ratio": [0.0, 1.0]}, "ratio"),
    ({"ratio": 1.0}, "ratio"),
    ({"value": "noise"}, "value"),
    ({"value": [1, 2]}, "value"),
    ({"inplace": "yes"}, "inplace"),
    ({"prob": 0.5}, "prob"),
]


@pytest.mark.parametrize(("kwargs", "key"), ERASE_BAD)
def test_random_erasing_bad_arguments_name_their_key(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        _entry("RandomErasing", **kwargs)
    assert err.value.key_path == f"{KEY}.{key}"


def test_random_erasing_is_torchvisions() -> None:
    ours = _entry("RandomErasing", p=1.0, scale=[0.1, 0.3], value=[0.5, 0.6, 0.7]).transform
    theirs = T.RandomErasing(p=1.0, scale=(0.1, 0.3), value=[0.5, 0.6, 0.7])
    x = torch.rand(3, 16, 12)
    torch.manual_seed(3)
    a = ours(x.clone())
    torch.manual_seed(3)
    b = theirs(x.clone())
    assert torch.equal(a, b)
    erased = (a != x).any(0)
    assert 0.1 * 16 * 12 * 0.5 <= erased.sum() <= 0.3 * 16 * 12
    for c, v in enumerate((0.5, 0.6, 0.7)):
        assert torch.all(a[c][erased] == v)
    with pytest.raises(ConfigError, match="after ToTensor"):
        ours(_image())
    with pytest.raises(ConfigError, match="1 or 1") as err:
        ours(torch.rand(1, 8, 8))  # three fill values for a one-channel image
    assert err.value.key_path == f"{KEY}.value"

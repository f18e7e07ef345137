"""The default (tensor path) transforms draw from the same distributions as plain torchvision
with PIL, and every key still does what it says.

Each statistical test compares many outputs of vissl's chain (built from config entries by
vissl's builder, on the tensor path) with many outputs of the plain torchvision + PIL
chain, drawn with other seeds, by a two-sample Kolmogorov-Smirnov test (or binomial
bounds for rates). The seeds are fixed, so the tests are deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image, ImageFilter
from scipy import stats

from vissl.data import build_transforms

N = 600  # draws per side
P_MIN = 1e-3  # KS p-value below which two samples are called different


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def coordinate_image(width: int = 200, height: int = 150) -> Image.Image:
    """Red = x, green = y (in pixels), blue = 0: a crop's values tell where it was cut."""
    x = np.broadcast_to(np.arange(width, dtype=np.uint8)[None, :], (height, width))
    y = np.broadcast_to(np.arange(height, dtype=np.uint8)[:, None], (height, width))
    return Image.fromarray(np.stack([x, y, np.zeros_like(x)], axis=2))


def colour_image(size: int = 40) -> Image.Image:
    rng = np.random.default_rng(5)
    base = rng.integers(40, 216, (size // 8, size // 8, 3), dtype=np.uint8)
    return Image.fromarray(base).resize((size, size), Image.NEAREST)


def vissl_outputs(entries: Sequence[dict[str, Any]], image: Image.Image, n: int = N) -> list:
    """``n`` outputs (lists of crops) of vissl's chain, seeded 0..n-1 as the dataset does."""
    chain = build_transforms([dict(e) for e in entries])
    assert chain.transforms[0].name == "ToImageTensor"  # the default path is under test
    outs = []
    for seed in range(n):
        torch.default_generator.manual_seed(seed)
        sample = {"data": [image], "label": [0], "data_valid": [1], "data_idx": [0]}
        outs.append(chain(sample)["data"])
    return outs


def plain_outputs(views: Sequence[Callable[[Any], Any]], image: Image.Image, n: int = N) -> list:
    """``n`` outputs of plain torchvision/PIL per-view pipelines, other seeds."""
    outs = []
    for seed in range(10_000, 10_000 + n):
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        outs.append([view(image) for view in views])
    return outs


def box_stats(crop: torch.Tensor, width: int, height: int) -> tuple[float, float, float, bool]:
    """(area fraction, log aspect, centre x, flipped) of a crop of ``coordinate_image``."""
    red, green = crop[0] * 255, crop[1] * 255
    w = float(red.max() - red.min()) + 1
    h = float(green.max() - green.min()) + 1
    flipped = bool(red[:, 0].mean() > red[:, -1].mean())
    return w * h / (width * height), float(np.log(w / h)), float(red.mean()), flipped


def same_distribution(a: Sequence[float], b: Sequence[float]) -> bool:
    return bool(stats.ks_2samp(a, b).pvalue > P_MIN)


def binomial_ok(hits: int, n: int, p: float) -> bool:
    """``hits`` of ``n`` within 3.5 standard deviations of ``n * p``."""
    return abs(hits - n * p) <= 3.5 * np.sqrt(n * p * (1 - p)) + 1e-9


def test_crop_and_flip_geometry_matches_torchvision():
    image = coordinate_image()
    entries = [
        {"name": "RandomResizedCrop", "size": 32, "scale": [0.2, 0.9], "ratio": [0.6, 1.0]},
        {"name": "RandomHorizontalFlip", "p": 0.3},
        {"name": "ToTensor"},
    ]
    plain = T.Compose(
        [
            T.RandomResizedCrop(32, scale=(0.2, 0.9), ratio=(0.6, 1.0)),
            T.RandomHorizontalFlip(0.3),
            T.ToTensor(),
        ]
    )
    ours = [box_stats(o[0], 200, 150) for o in vissl_outputs(entries, image)]
    theirs = [box_stats(o[0], 200, 150) for o in plain_outputs([plain], image)]
    for column in range(3):  # area, aspect, position
        assert same_distribution([s[column] for s in ours], [s[column] for s in theirs])
    assert all(0.15 < s[0] < 0.95 for s in ours)  # inside the scale range (+ resize blur)
    assert all(np.log(0.55) < s[1] < np.log(1.1) for s in ours)  # inside the ratio range
    flips = sum(s[3] for s in ours)
    assert binomial_ok(flips, N, 0.3) and binomial_ok(sum(s[3] for s in theirs), N, 0.3)


def colour_stats(view: torch.Tensor) -> tuple[float, float, float, bool]:
    """(mean luma, mean saturation, mean red - green, grey) of a float RGB image."""
    high, low = view.amax(0), view.amin(0)
    saturation = float(((high - low) / high.clamp(min=1e-6)).mean())
    luma = float((0.299 * view[0] + 0.587 * view[1] + 0.114 * view[2]).mean())
    grey = bool((high - low).max() <= 1.5 / 255)
    return luma, saturation, float((view[0] - view[1]).mean()), grey


def test_colour_distortion_matches_torchvision():
    image = colour_image()
    entries = [{"name": "ImgPilColorDistortion", "strength": 1.0}, {"name": "ToTensor"}]
    jitter = T.ColorJitter(0.8, 0.8, 0.8, 0.2)
    plain = T.Compose([T.RandomApply([jitter], p=0.8), T.RandomGrayscale(0.2), T.ToTensor()])
    ours = [colour_stats(o[0]) for o in vissl_outputs(entries, image)]
    theirs = [colour_stats(o[0]) for o in plain_outputs([plain], image)]
    for column in range(3):  # brightness, saturation, hue (as red - green)
        assert same_distribution([s[column] for s in ours], [s[column] for s in theirs])
    assert binomial_ok(sum(s[3] for s in ours), N, 0.2)
    assert binomial_ok(sum(s[3] for s in theirs), N, 0.2)


def hue_angle(view: torch.Tensor) -> float:
    """The mean hue (an angle in the opponent plane) of a float RGB image."""
    red, green, blue = view[0].mean(), view[1].mean(), view[2].mean()
    return float(torch.atan2(np.sqrt(3) * (green - blue), 2 * red - green - blue))


def contrast(view: torch.Tensor) -> float:
    return float((0.299 * view[0] + 0.587 * view[1] + 0.114 * view[2]).std())


@pytest.mark.parametrize(
    ("jitter", "statistic"),
    [
        ({"brightness": 0.8}, lambda v: colour_stats(v)[0]),
        ({"contrast": 0.8}, contrast),
        ({"saturation": 0.8}, lambda v: colour_stats(v)[1]),
        ({"hue": 0.2}, hue_angle),
    ],
    ids=["brightness", "contrast", "saturation", "hue"],
)
def test_each_jitter_factor_matches_torchvision(jitter, statistic):
    image = colour_image(24)
    entries = [{"name": "ColorJitter", **jitter}, {"name": "ToTensor"}]
    ours = [statistic(o[0]) for o in vissl_outputs(entries, image)]
    plain = T.Compose([T.ColorJitter(**jitter), T.ToTensor()])
    theirs = [statistic(o[0]) for o in plain_outputs([plain], image)]
    assert same_distribution(ours, theirs)
    assert np.std(ours) > 1e-3  # the factor does vary


def sharpness(view: torch.Tensor) -> float:
    return float((view[:, :, 1:] - view[:, :, :-1]).abs().mean())


class PilBlur:
    """The hand-written SimCLR blur: PIL GaussianBlur, radius U(0.1, 2), probability p."""

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, image: Image.Image) -> Image.Image:
        if random.random() >= self.p:
            return image
        return image.filter(ImageFilter.GaussianBlur(random.uniform(0.1, 2.0)))


def test_blur_rate_and_strength_match_pil():
    rng = np.random.default_rng(1)
    image = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    entries = [{"name": "ImgPilGaussianBlur", "p": 0.5}, {"name": "ToTensor"}]
    ours = [sharpness(o[0]) for o in vissl_outputs(entries, image)]
    theirs = [
        sharpness(o[0]) for o in plain_outputs([T.Compose([PilBlur(0.5), T.ToTensor()])], image)
    ]
    assert same_distribution(ours, theirs)
    original = sharpness(T.ToTensor()(image))
    blurred = sum(s < original * 0.98 for s in ours)
    assert binomial_ok(blurred, N, 0.5 * (2.0 - 0.3) / 1.9)  # radii under ~0.3 barely blur


def test_multicrop_sizes_scales_and_per_type_blur():
    image = coordinate_image()
    entries = [
        {
            "name": "ImgPilToMultiCrop",
            "total_num_crops": 3,
            "size_crops": [24, 12],
            "num_crops": [1, 2],
            "crop_scales": [[0.5, 1.0], [0.05, 0.2]],
        },
        {
            "name": "ImgPilMultiCropRandomApply",
            "transforms": [{"name": "ImgPilGaussianBlur", "p": 1.0, "radius_min": 2.0}],
            "prob": [0.0, 1.0],
            "nmb_crops": [1, 2],
        },
        {"name": "ToTensor"},
    ]
    outs = vissl_outputs(entries, image, n=60)
    for crops in outs:
        assert [c.shape[-1] for c in crops] == [24, 12, 12]
        big, *small = (box_stats(c, 200, 150)[0] for c in crops)
        assert 0.45 < big <= 1.0
        assert all(0.01 < s < 0.3 for s in small)  # blur pulls the extremes in a little
        # type 0 never blurred: its pixels are exact ramps (steps of 1 grey level)
        steps = (crops[0][0, 0, 1:] - crops[0][0, 0, :-1]).abs() * 255
        assert float(steps.max()) >= 1.0


def one(entries: Sequence[dict[str, Any]], image: Image.Image, seed: int = 0) -> torch.Tensor:
    chain = build_transforms([dict(e) for e in entries])
    torch.default_generator.manual_seed(seed)
    return chain({"data": [image], "label": [0], "data_valid": [1], "data_idx": [0]})["data"][0]


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "RandomHorizontalFlip", "p": 0.0},
        {"name": "ImgPilGaussianBlur", "p": 0.0},
        {"name": "ImgPilRandomSolarize", "p": 0.0},
        {
            "name": "ImgPilColorDistortion",
            "color_jitter_probability": 0,
            "grayscale_probability": 0,
        },
        {"name": "RandomGrayscale", "p": 0.0},
    ],
)
def test_probability_zero_leaves_the_image(entry):
    image = colour_image()
    expected = T.ToTensor()(image)
    for seed in range(20):
        assert torch.equal(one([entry, {"name": "ToTensor"}], image, seed), expected)


def test_probability_one_always_applies():
    image = coordinate_image(64, 48)
    to_tensor = {"name": "ToTensor"}
    flips = [
        one([{"name": "RandomHorizontalFlip", "p": 1.0}, to_tensor], image, s) for s in range(10)
    ]
    assert all(box_stats(f, 64, 48)[3] for f in flips)
    grey = {"name": "ImgPilColorDistortion", "grayscale_probability": 1.0}
    assert all(colour_stats(one([grey, to_tensor], colour_image(), s))[3] for s in range(10))
    blur = {"name": "ImgPilGaussianBlur", "p": 1.0, "radius_min": 1.5, "radius_max": 1.5}
    expected = T.ToTensor()(colour_image().filter(ImageFilter.GaussianBlur(1.5)))
    got = one([blur, to_tensor], colour_image())
    assert float((got - expected).abs().mean()) * 255 < 0.7
    ramp = Image.fromarray(np.arange(256, dtype=np.uint8).reshape(16, 16)).convert("RGB")
    solarize = {"name": "ImgPilRandomSolarize", "p": 1.0}
    solarized = [one([solarize, to_tensor], ramp, s) for s in range(20)]
    plain = T.ToTensor()(ramp)  # only the threshold 256 (1 in 257) leaves it unchanged
    assert sum(not torch.equal(s, plain) for s in solarized) == 20


def test_jitter_factors_stay_in_their_ranges():
    image = Image.new("RGB", (16, 16), (100, 120, 110))
    mean = np.mean([100, 120, 110]) / 255
    brightness = [
        float(
            one([{"name": "ColorJitter", "brightness": 0.5}, {"name": "ToTensor"}], image, s).mean()
        )
        / mean
        for s in range(200)
    ]
    assert 0.5 - 1e-3 <= min(brightness) < 0.55 and 1.45 < max(brightness) <= 1.5 + 1e-3
    hue = [
        one([{"name": "ColorJitter", "hue": 0.1}, {"name": "ToTensor"}], image, s)
        for s in range(50)
    ]
    assert all(abs(float(h.amax(0).mean()) - 120 / 255) < 1e-5 for h in hue)  # value kept
    colours = {tuple(round(float(c), 3) for c in h.mean(dim=(1, 2))) for h in hue}
    assert len(colours) > 20  # the hue moves

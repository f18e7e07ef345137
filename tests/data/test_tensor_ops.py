"""The tensor operations match the PIL operations they stand for (up to 8-bit rounding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as F
from PIL import Image, ImageDraw, ImageFilter, ImageOps

from vissl.data.ssl_transforms import tensor_ops as ops

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    """A 160x120 picture with gradients, saturated shapes, grey areas and noise."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:120, 0:160].astype(np.float32)
    pixels = np.stack(
        [128 + 90 * np.sin(xx / 23), 128 + 90 * np.cos(yy / 17), 128 + 60 * np.sin((xx + yy) / 31)],
        axis=2,
    )
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(25):
        x, y = int(rng.integers(0, 150)), int(rng.integers(0, 110))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        draw.ellipse([x, y, x + int(rng.integers(4, 40)), y + int(rng.integers(4, 40))], fill=fill)
    draw.rectangle([0, 0, 30, 30], fill=(90, 90, 90))  # grey: no hue
    noisy = np.asarray(image).astype(np.int16) + rng.integers(-8, 9, (120, 160, 3))
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def levels(pil: Image.Image, tensor: torch.Tensor) -> np.ndarray:
    """|PIL - tensor| per pixel and channel, in 8-bit grey levels."""
    expected = np.asarray(pil).astype(np.float64)
    if expected.ndim == 2:
        expected = expected[:, :, None]
    got = tensor.permute(1, 2, 0).double().numpy()
    if tensor.dtype != torch.uint8:
        got = got * 255.0
    return np.abs(expected - got)


def test_pil_to_uint8_is_a_channels_first_view_of_the_pixels(photo):
    tensor = ops.pil_to_uint8(photo)
    assert tensor.shape == (3, 120, 160) and tensor.dtype == torch.uint8
    assert np.array_equal(tensor.permute(1, 2, 0).numpy(), np.asarray(photo))
    assert ops.pil_to_uint8(photo.convert("L")).shape == (1, 120, 160)
    assert ops.pil_to_uint8(photo.convert("RGBA")).shape == (3, 120, 160)


def test_to_float_is_a_new_tensor_divided_as_to_tensor():
    image = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8)
    as_float = ops.to_float(image)
    assert as_float.dtype == torch.float32 and as_float.is_contiguous()
    assert torch.equal(as_float, image.float() / 255)  # as ToTensor, bit for bit
    copy = ops.to_float(as_float)
    assert copy is not as_float and torch.equal(copy, as_float)


@pytest.mark.parametrize("box", [(10, 20, 100, 80), (0, 0, 160, 120), (50, 40, 30, 25)])
def test_resized_crop_is_a_pil_crop_then_bilinear_resize(photo, box):
    left, top, width, height = box
    crop = photo.crop((left, top, left + width, top + height))
    expected = crop.resize((64, 48), Image.BILINEAR)
    got = ops.resized_crop(ops.pil_to_uint8(photo), top, left, height, width, (48, 64))
    assert got.dtype == torch.uint8 and got.shape == (3, 48, 64)
    diff = levels(expected, got)
    assert diff.mean() < 0.2 and np.percentile(diff, 99.9) <= 2


def test_resized_crop_of_float_and_single_channel_images(photo):
    grey = ops.pil_to_uint8(photo.convert("L"))
    out = ops.resized_crop(grey, 0, 0, 120, 160, (30, 40))
    expected = photo.convert("L").resize((40, 30), Image.BILINEAR)
    assert out.shape == (1, 30, 40)
    assert levels(expected, out).mean() < 0.6
    as_float = ops.resized_crop(ops.to_float(ops.pil_to_uint8(photo)), 5, 5, 50, 50, (25, 25))
    assert as_float.dtype == torch.float32 and as_float.shape == (3, 25, 25)


@pytest.mark.parametrize(
    ("pil_op", "tensor_op", "factor", "max_levels"),
    [
        (F.adjust_brightness, ops.adjust_brightness_, 0.3, 1.0),
        (F.adjust_brightness, ops.adjust_brightness_, 1.7, 1.0),
        (F.adjust_contrast, ops.adjust_contrast_, 0.4, 1.0),
        (F.adjust_contrast, ops.adjust_contrast_, 1.8, 1.0),
        (F.adjust_saturation, ops.adjust_saturation_, 0.2, 1.5),
        (F.adjust_saturation, ops.adjust_saturation_, 1.8, 1.5),
    ],
)
def test_enhance_operations_match_pil(photo, pil_op, tensor_op, factor, max_levels):
    got = tensor_op(ops.to_float(ops.pil_to_uint8(photo)), factor)
    diff = levels(pil_op(photo, factor), got)
    assert diff.max() <= max_levels and diff.mean() < 0.5


@pytest.mark.parametrize("hue_factor", [-0.5, -0.2, -0.05, 0.013, 0.1, 0.33])
def test_hue_matches_pils_hsv_round_trip(photo, hue_factor):
    got = ops.adjust_hue_(ops.to_float(ops.pil_to_uint8(photo)), hue_factor)
    diff = levels(F.adjust_hue(photo, hue_factor), got)
    # Pillow quantizes H, S and V to 8 bits on the way: a few levels on saturated pixels
    assert diff.mean() < 1.2 and np.percentile(diff, 99) <= 7


def test_hue_rotation_of_primaries_and_whole_turn_steps():
    red = torch.tensor([1.0, 0.0, 0.0]).view(3, 1, 1)
    third = 85 / 255  # PIL shifts its 8-bit hue by int(factor * 255) steps of 1/255 turn
    assert torch.allclose(ops.adjust_hue_(red.clone(), third).flatten(), torch.tensor([0, 1.0, 0]))
    assert torch.allclose(ops.adjust_hue_(red.clone(), -third).flatten(), torch.tensor([0, 0, 1.0]))
    assert ops.hue_shift_turns(0.003) == 0.0  # int(0.765) == 0: no rotation
    assert ops.hue_shift_turns(-0.1) == -25 / 255
    grey = torch.full((3, 2, 2), 0.4)
    assert torch.equal(ops.adjust_hue_(grey.clone(), 0.25), grey)


def test_grayscale_matches_pil_luma(photo):
    got = ops.to_grayscale(ops.to_float(ops.pil_to_uint8(photo)), 3)
    assert got.shape == (3, 120, 160)
    assert levels(photo.convert("L").convert("RGB"), got).max() <= 0.51
    assert ops.to_grayscale(ops.to_float(ops.pil_to_uint8(photo)), 1).shape == (1, 120, 160)


@pytest.mark.parametrize("radius", [0.5, 1.0, 1.6, 2.0])
def test_blur_kernel_is_pillows_impulse_response(radius):
    line = np.zeros((1, 61), np.uint8)
    line[0, 30] = 255
    response = np.asarray(Image.fromarray(line).filter(ImageFilter.GaussianBlur(radius)))[0]
    kernel = np.asarray(ops._box_blur_kernel(radius)) * 255
    half = len(kernel) // 2
    mine = np.zeros(61)
    mine[30 - half : 31 + half] = kernel
    assert abs(sum(ops._box_blur_kernel(radius)) - 1.0) < 1e-9
    assert np.abs(response - mine).max() <= 1.0  # Pillow rounds after each of its passes


@pytest.mark.parametrize("radius", [0.1, 0.7, 1.5, 2.0])
def test_gaussian_blur_matches_pil(photo, radius):
    source = ops.pil_to_uint8(photo)
    got = ops.gaussian_blur(source, radius)
    diff = levels(photo.filter(ImageFilter.GaussianBlur(radius)), got)
    assert diff.mean() < 0.7 and np.percentile(diff, 99) <= 2.5
    assert torch.equal(source, ops.pil_to_uint8(photo))  # input untouched


@pytest.mark.parametrize("threshold", [0, 1, 128, 200, 256])
def test_solarize_matches_pil(photo, threshold):
    expected = ImageOps.solarize(photo, threshold)
    as_uint8 = ops.pil_to_uint8(photo)
    assert levels(expected, ops.solarize(as_uint8, threshold)).max() == 0
    assert levels(expected, ops.solarize(ops.to_float(as_uint8), threshold)).max() < 1e-3


def test_in_place_operations_only_touch_their_argument(photo):
    source = ops.to_float(ops.pil_to_uint8(photo))
    keep = source.clone()
    ops.to_grayscale(source, 3)
    ops.gaussian_blur(source, 1.0)
    ops.solarize(source, 100)
    ops.resized_crop(source, 0, 0, 50, 50, (20, 20))
    assert torch.equal(source, keep)
    ops.adjust_hue_(source, 0.2)
    assert not torch.equal(source, keep)

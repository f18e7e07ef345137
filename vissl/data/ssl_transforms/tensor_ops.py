"""Image operations on tensors that do what the PIL operations of the transforms do.

The tensor path of the transforms (see :mod:`vissl.data.ssl_transforms.tensor_path`) keeps
an image as a ``(C, H, W)`` tensor between the crop and ``ToTensor``: ``uint8`` (0..255,
usually a channels-last view of the decoded pixels) until the first colour operation,
then ``float32`` in ``[0, 1]``. Each function here is the tensor form of one PIL
operation, with the same formula and the same constants as Pillow:

- resizing: torch's antialiased bilinear resize, which follows Pillow's filter (its
  ``uint8`` channels-last kernel is the fast one);
- brightness, contrast, saturation: Pillow's ``ImageEnhance`` blends (with a black image,
  with the rounded mean grey level, with the grey image), clipped to the valid range;
- hue: a rotation of the HSV hue by whole 1/255 turns, as torchvision's PIL path does;
- grey: Pillow's ``L`` conversion (ITU-R 601-2 luma in 16-bit fixed point);
- Gaussian blur: Pillow's ``GaussianBlur(radius)``, three extended box filters per
  direction (Gwosdek et al. 2011), each replicating the edge pixels;
- solarize: Pillow's ``ImageOps.solarize`` threshold on the 8-bit value.

What differs is only rounding: Pillow rounds to 8 bits after every operation, these
functions keep floats until the end. The functions never modify their input; those
ending in ``_`` modify a float tensor the caller owns.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

#: Pillow's luma weights for ``convert("L")`` (16-bit fixed point, ITU-R 601-2).
LUMA_WEIGHTS = (19595 / 65536, 38470 / 65536, 7471 / 65536)
#: Pillow's hue resolution: an HSV ``H`` of 0..255 covers one turn.
HUE_STEPS = 255


def pil_to_uint8(image: Image.Image) -> torch.Tensor:
    """A PIL image as a ``(C, H, W)`` uint8 tensor (a channels-last view of one copy).

    ``1``/``P``/``RGBA``/... images are converted to RGB (``L`` stays single-channel),
    as ``ToTensor`` would see them after the data source's ``convert("RGB")``.
    """
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    array = np.array(image)  # writable (np.asarray would be a read-only view of bytes)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1)


def to_float(image: torch.Tensor) -> torch.Tensor:
    """A new contiguous float32 copy of ``image`` in ``[0, 1]`` (uint8 is divided by 255)."""
    out = torch.empty(image.shape, dtype=torch.float32)
    out.copy_(image)
    if image.dtype == torch.uint8:
        out.div_(255.0)  # as ToTensor: bit for bit
    return out


def resized_crop(
    image: torch.Tensor, top: int, left: int, height: int, width: int, size: tuple[int, int]
) -> torch.Tensor:
    """Crop the box ``(top, left, height, width)`` and resize it to ``size`` ``(h, w)``.

    As torchvision's ``resized_crop`` of a PIL image: ``crop`` then Pillow's antialiased
    ``BILINEAR`` resize, which sees only the pixels of the box. The box must lie in the
    image; the result has the dtype of ``image``.
    """
    crop = image[:, top : top + height, left : left + width]
    out_h, out_w = int(size[0]), int(size[1])
    if (out_h, out_w) == (height, width):
        return crop.clone()
    fast_uint8 = image.dtype == torch.uint8 and image.shape[0] in (3, 4)
    if fast_uint8:
        # torch's fast uint8 kernel wants channels-last memory
        batch = crop.unsqueeze(0).contiguous(memory_format=torch.channels_last)
    else:
        batch = crop.unsqueeze(0).float()
    out = F.interpolate(
        batch, size=(out_h, out_w), mode="bilinear", antialias=True, align_corners=False
    )[0]
    if image.dtype == torch.uint8 and not fast_uint8:
        return out.round_().clamp_(0.0, 255.0).to(torch.uint8)
    return out


def luma(image: torch.Tensor) -> torch.Tensor:
    """The ``(1, H, W)`` grey level of a float RGB image (Pillow's ``L`` weights)."""
    if image.shape[0] == 1:
        return image.clone()
    red, green, blue = image[0], image[1], image[2]
    grey = red * LUMA_WEIGHTS[0]
    grey.add_(green, alpha=LUMA_WEIGHTS[1]).add_(blue, alpha=LUMA_WEIGHTS[2])
    return grey.unsqueeze(0)


def adjust_brightness_(image: torch.Tensor, factor: float) -> torch.Tensor:
    """Blend with black (``ImageEnhance.Brightness``), in place."""
    return image.mul_(factor).clamp_(0.0, 1.0)


def adjust_contrast_(image: torch.Tensor, factor: float) -> torch.Tensor:
    """Blend with the mean grey level, rounded to 8 bits (``ImageEnhance.Contrast``)."""
    if image.shape[0] == 1:
        mean = image.mean().item()
    else:
        channel_means = image.mean(dim=(1, 2)).tolist()
        mean = sum(w * m for w, m in zip(LUMA_WEIGHTS, channel_means))
    mean = math.floor(mean * 255.0 + 0.5) / 255.0  # Pillow's degenerate image is 8-bit
    return image.mul_(factor).add_((1.0 - factor) * mean).clamp_(0.0, 1.0)


def adjust_saturation_(image: torch.Tensor, factor: float) -> torch.Tensor:
    """Blend with the grey image (``ImageEnhance.Color``), in place."""
    if image.shape[0] == 1:
        return image
    grey = luma(image)
    return image.mul_(factor).add_(grey, alpha=1.0 - factor).clamp_(0.0, 1.0)


def hue_shift_turns(hue_factor: float) -> float:
    """The hue rotation torchvision's PIL path applies for ``hue_factor``: whole 1/255 turns.

    It adds ``int(hue_factor * 255)`` (truncated) to Pillow's 8-bit hue.
    """
    return int(hue_factor * HUE_STEPS) / HUE_STEPS


def adjust_hue_(image: torch.Tensor, hue_factor: float) -> torch.Tensor:
    """Rotate the HSV hue by :func:`hue_shift_turns` ``(hue_factor)``, in place.

    Value (the largest channel) and chroma (largest minus smallest) are kept, as in
    Pillow's HSV round trip; a shift of zero turns leaves the image as it is.
    """
    shift = hue_shift_turns(hue_factor) % 1.0
    if image.shape[0] == 1 or shift == 0.0:
        return image
    red, green, blue = image[0], image[1], image[2]
    high = torch.maximum(torch.maximum(red, green), blue)
    chroma = high - torch.minimum(torch.minimum(red, green), blue)
    # 0/1 masks of the channel that holds the maximum (red first, then green, then blue);
    # sign() instead of comparisons: bool tensors are slow to make and to mix in
    is_red = (red - high).sign_().add_(1.0)
    is_green = (green - high).sign_().add_(1.0).mul_(1.0 - is_red)
    is_blue = (1.0 - is_red).sub_(is_green)
    # hue in sixths of a turn: (g - b) / C by red, 2 + (b - r) / C by green,
    # 4 + (r - g) / C by blue; then rotated and wrapped into [0, 6)
    hue = (green - blue).mul_(is_red)
    hue.addcmul_((blue - red).add_(chroma, alpha=2.0), is_green)
    hue.addcmul_((red - green).add_(chroma, alpha=4.0), is_blue)
    hue.div_(chroma.clamp(min=1e-12)).add_(6.0 * shift + 6.0)
    hue.add_(torch.floor(hue * (1.0 / 6.0)), alpha=-6.0)
    # HSV to RGB: a channel is `high` within 1 sixth of its centre (red 0, green 2,
    # blue 4), `high - C` beyond 2 sixths, linear between:
    #   green = (high + C) - C * clamp(|h - 2|, 1, 2), blue likewise with |h - 4|,
    #   red = (high - 2C) + C * clamp(|h - 3|, 1, 2) (its centre wraps around at 0 = 6)
    top = high + chroma
    for channel, centre in ((green, 2.0), (blue, 4.0)):
        ramp = (hue - centre).abs_().clamp_(1.0, 2.0).mul_(chroma)
        torch.sub(top, ramp, out=channel)
    ramp = (hue - 3.0).abs_().clamp_(1.0, 2.0).mul_(chroma)
    torch.add(high.sub_(chroma, alpha=2.0), ramp, out=red)
    return image


def to_grayscale(image: torch.Tensor, num_output_channels: int) -> torch.Tensor:
    """A new float grey image (``convert("L")``) with 1 or 3 identical channels."""
    grey = luma(image)
    if num_output_channels == 1:
        return grey
    return grey.expand(num_output_channels, -1, -1).contiguous()


def solarize(image: torch.Tensor, threshold: float) -> torch.Tensor:
    """Invert the pixels whose 8-bit value is >= ``threshold`` (``ImageOps.solarize``)."""
    if threshold > 255:
        return image.clone()
    if image.dtype == torch.uint8:
        return torch.where(image >= threshold, 255 - image, image)
    limit = (threshold - 0.5) / 255.0  # the float that rounds to ``threshold``
    return torch.where(image >= limit, 1.0 - image, image)


def _box_weights(radius: float, passes: int = 3) -> list[float]:
    """One of Pillow's extended boxes for ``GaussianBlur(radius)`` (``passes`` of them).

    Pillow picks the box for a Gaussian of variance ``radius**2 / passes`` as Gwosdek et
    al. (2011) do (eq. 7-14): ``2 l + 1`` whole pixels and one fractional pixel each side.
    """
    sigma2 = radius * radius / passes
    length = math.sqrt(12.0 * sigma2 + 1.0)
    whole = math.floor((length - 1.0) / 2.0)
    frac = (2 * whole + 1) * (whole * (whole + 1) - 3 * sigma2)
    frac /= 6 * (sigma2 - (whole + 1) * (whole + 1))
    norm = 2.0 * (whole + frac) + 1.0
    return [frac / norm] + [1.0 / norm] * (2 * whole + 1) + [frac / norm]


def _box_blur_kernel(radius: float, passes: int = 3) -> list[float]:
    """The 1-D kernel of Pillow's ``GaussianBlur(radius)`` away from the borders."""
    box = np.asarray(_box_weights(radius, passes))
    kernel = box
    for _ in range(passes - 1):
        kernel = np.convolve(kernel, box)
    return kernel.tolist()  # type: ignore[no-any-return]


def _box_passes(image: torch.Tensor, box: list[float], passes: int, dim: int) -> torch.Tensor:
    """``passes`` convolutions of ``image`` (C, H, W) with ``box`` along ``dim`` (1 or 2),
    each replicating the edge pixels, as Pillow's box blur does pass by pass."""
    half = len(box) // 2
    size = image.shape[dim]
    shape = list(image.shape)
    shape[dim] += 2 * half
    buffers = (torch.empty(shape, dtype=image.dtype), torch.empty(shape, dtype=image.dtype))
    buffers[0].narrow(dim, half, size).copy_(image)
    for p in range(passes):
        source, target = buffers[p % 2], buffers[(p + 1) % 2]
        # replicate the edges of the source's interior into its padding
        first, last = source.narrow(dim, half, 1), source.narrow(dim, half + size - 1, 1)
        source.narrow(dim, 0, half).copy_(first.expand_as(source.narrow(dim, 0, half)))
        source.narrow(dim, half + size, half).copy_(last.expand_as(source.narrow(dim, 0, half)))
        out = target.narrow(dim, half, size)
        torch.mul(source.narrow(dim, half, size), box[half], out=out)
        for k in range(half):
            out.add_(source.narrow(dim, k, size), alpha=box[k])
            out.add_(source.narrow(dim, 2 * half - k, size), alpha=box[k])
    return buffers[passes % 2].narrow(dim, half, size)


def gaussian_blur(image: torch.Tensor, radius: float, passes: int = 3) -> torch.Tensor:
    """A new float image blurred as Pillow's ``ImageFilter.GaussianBlur(radius)``.

    Pillow's blur: ``passes`` extended box filters per direction, each replicating the
    edge pixels (so the borders match too); it only rounds to 8 bits after every pass.
    """
    image = to_float(image) if image.dtype == torch.uint8 else image
    if radius <= 0:
        return image.clone()
    box = _box_weights(float(radius), passes)
    vertical = _box_passes(image, box, passes, dim=1)
    return _box_passes(vertical, box, passes, dim=2).contiguous()


def normalize_(image: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``(image - mean) / std`` per channel, in place (``mean``/``std`` are (C, 1, 1))."""
    return image.sub_(mean).div_(std)

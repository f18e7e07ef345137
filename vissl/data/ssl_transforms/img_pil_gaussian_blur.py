"""``ImgPilGaussianBlur``: random Gaussian blur of a PIL image."""

from __future__ import annotations

import torch
from PIL import Image, ImageFilter

from vissl.data.ssl_transforms import register_transform


@register_transform("ImgPilGaussianBlur")
class ImgPilGaussianBlur:
    """With probability ``p``, blur with a radius drawn from ``[radius_min, radius_max]``.

    Randomness comes from torch's generator, which vissl seeds per data loader worker.

    Args:
        p: probability of blurring.
        radius_min: smallest blur radius.
        radius_max: largest blur radius.
    """

    def __init__(self, p: float = 0.5, radius_min: float = 0.1, radius_max: float = 2.0) -> None:
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        if radius_min > radius_max or radius_min < 0:
            raise ValueError(
                f"need 0 <= radius_min <= radius_max, got {radius_min!r} and {radius_max!r}"
            )
        self.prob = float(p)
        self.radius_min = float(radius_min)
        self.radius_max = float(radius_max)

    def __call__(self, image: Image.Image) -> Image.Image:
        if torch.rand(()).item() > self.prob:
            return image
        radius = self.radius_min + (self.radius_max - self.radius_min) * torch.rand(()).item()
        return image.filter(ImageFilter.GaussianBlur(radius=radius))

    def __repr__(self) -> str:
        return (
            f"ImgPilGaussianBlur(p={self.prob}, radius_min={self.radius_min}, "
            f"radius_max={self.radius_max})"
        )

"""``ImgPilGaussianBlur``: random Gaussian blur of a PIL image."""

from __future__ import annotations

from typing import Any

import torch
from PIL import ImageFilter

from vissl.data.ssl_transforms import register_transform, tensor_ops


@register_transform("ImgPilGaussianBlur")
class ImgPilGaussianBlur:
    """With probability ``p``, blur with a radius drawn from ``[radius_min, radius_max]``.

    Randomness comes from torch's generator, which vissl seeds per data loader worker.
    It also takes a ``(C, H, W)`` image tensor (uint8, or float in [0, 1]): the same draws,
    Pillow's blur kernel (:func:`~vissl.data.ssl_transforms.tensor_ops.gaussian_blur`).

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

    def __call__(self, image: Any) -> Any:
        if torch.rand(()).item() > self.prob:
            return image
        radius = self.radius_min + (self.radius_max - self.radius_min) * torch.rand(()).item()
        if isinstance(image, torch.Tensor):
            return tensor_ops.gaussian_blur(image, radius)
        return image.filter(ImageFilter.GaussianBlur(radius=radius))

    def tensor_transform(self) -> ImgPilGaussianBlur:
        """Itself: it takes tensors as well (see :mod:`.tensor_path`)."""
        return self

    def __repr__(self) -> str:
        return (
            f"ImgPilGaussianBlur(p={self.prob}, radius_min={self.radius_min}, "
            f"radius_max={self.radius_max})"
        )

"""``ImgPilRandomSolarize``: BYOL's random solarization."""

from __future__ import annotations

from typing import Any

import torch
from PIL import ImageOps

from vissl.data.ssl_transforms import register_transform, tensor_ops


@register_transform("ImgPilRandomSolarize")
class ImgPilRandomSolarize:
    """With probability ``p``, solarize with a threshold drawn uniformly from 0..256.

    As in VISSL (https://arxiv.org/abs/2006.07733): pixels at or above the threshold
    are inverted; a threshold of 256 leaves the image unchanged.

    Args:
        p: probability of solarizing (VISSL's default 0.66).
        prob: the same, under the name of VISSL's Python constructor
            (``ImgPilRandomSolarize(prob=0.2)``); configs use ``p``.
    """

    def __init__(self, p: float = 0.66, prob: float | None = None) -> None:
        if prob is not None:
            p = prob
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a number in [0, 1], got {p!r}")
        self.p = float(p)

    def __call__(self, image: Any) -> Any:
        if torch.rand(()).item() >= self.p:
            return image
        threshold = int(torch.randint(0, 257, ()).item())
        if isinstance(image, torch.Tensor):
            return tensor_ops.solarize(image, threshold)
        return ImageOps.solarize(image, threshold)

    def tensor_transform(self) -> ImgPilRandomSolarize:
        """Itself: it takes ``(C, H, W)`` tensors as well (see :mod:`.tensor_path`)."""
        return self

    def __repr__(self) -> str:
        return f"ImgPilRandomSolarize(p={self.p})"

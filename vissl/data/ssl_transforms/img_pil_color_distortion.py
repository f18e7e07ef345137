"""``ImgPilColorDistortion``: SimCLR's colour jitter plus random grayscale."""

from __future__ import annotations

from typing import Any

import torchvision.transforms as tv_transforms
from PIL import Image

from vissl.data.ssl_transforms import register_transform
from vissl.data.ssl_transforms.tensor_path import tensor_twin


@register_transform("ImgPilColorDistortion")
class ImgPilColorDistortion:
    """Random colour distortion as in SimCLR (https://arxiv.org/abs/2002.05709).

    With probability ``color_jitter_probability`` apply
    ``ColorJitter(brightness*s, contrast*s, saturation*s, hue*s)`` (``s`` = strength),
    then convert to grayscale with probability ``grayscale_probability``.

    Args:
        strength: scale of the jitter.
        brightness: jitter of brightness before scaling.
        contrast: jitter of contrast before scaling.
        saturation: jitter of saturation before scaling.
        hue: jitter of hue before scaling (``hue * strength`` must be <= 0.5).
        color_jitter_probability: probability of the jitter.
        grayscale_probability: probability of the grayscale conversion.
    """

    def __init__(
        self,
        strength: float = 1.0,
        brightness: float = 0.8,
        contrast: float = 0.8,
        saturation: float = 0.8,
        hue: float = 0.2,
        color_jitter_probability: float = 0.8,
        grayscale_probability: float = 0.2,
    ) -> None:
        self.strength = strength
        jitter = tv_transforms.ColorJitter(
            brightness * strength, contrast * strength, saturation * strength, hue * strength
        )
        self.transforms = tv_transforms.Compose(
            [
                tv_transforms.RandomApply([jitter], p=color_jitter_probability),
                tv_transforms.RandomGrayscale(p=grayscale_probability),
            ]
        )

    def __call__(self, image: Image.Image) -> Image.Image:
        return self.transforms(image)

    def tensor_transform(self) -> Any:
        """The same jitter and grayscale on tensors (see :mod:`.tensor_path`)."""
        return tensor_twin(self.transforms)

    def __repr__(self) -> str:
        return f"ImgPilColorDistortion(strength={self.strength}, {self.transforms!r})"

"""``ImgPilToMultiCrop``: SwAV's multi-resolution random crops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torchvision.transforms as tv_transforms
from PIL import Image

from vissl.data.ssl_transforms import register_transform
from vissl.data.ssl_transforms.tensor_path import multi_crop_twin


@register_transform("ImgPilToMultiCrop")
class ImgPilToMultiCrop:
    """Turn one PIL image into ``total_num_crops`` random resized square crops.

    Crop type ``i`` is taken ``num_crops[i]`` times, with side ``size_crops[i]`` and
    scale range ``crop_scales[i]``; crops are ordered by type (as in SwAV/VISSL).
    A "copies" transform: each crop becomes its own entry of the sample's ``data``.

    Args:
        total_num_crops: total number of crops; must equal ``sum(num_crops)``.
        size_crops: side of each crop type.
        num_crops: number of crops of each type.
        crop_scales: ``[min, max]`` area scale of each crop type.
    """

    ssl_transform_kind: ClassVar[str] = "copies"

    def __init__(
        self,
        total_num_crops: int,
        size_crops: Sequence[int],
        num_crops: Sequence[int],
        crop_scales: Sequence[Sequence[float]],
    ) -> None:
        if sum(num_crops) != total_num_crops:
            raise ValueError(
                f"sum(num_crops)={sum(num_crops)} must equal total_num_crops={total_num_crops}"
            )
        if not len(size_crops) == len(num_crops) == len(crop_scales):
            raise ValueError(
                "size_crops, num_crops and crop_scales need one entry per crop type, got "
                f"{len(size_crops)}, {len(num_crops)} and {len(crop_scales)}"
            )
        for scale in crop_scales:
            if len(scale) != 2:
                raise ValueError(f"each crop_scales entry must be [min, max], got {scale!r}")
        self.total_num_crops = total_num_crops
        self.size_crops = list(size_crops)
        self.num_crops = list(num_crops)
        self.crop_scales = [tuple(float(s) for s in scale) for scale in crop_scales]
        self.transforms: list[tv_transforms.RandomResizedCrop] = []
        for num, size, scale in zip(self.num_crops, self.size_crops, self.crop_scales):
            crop = tv_transforms.RandomResizedCrop(size, scale=scale)
            self.transforms.extend([crop] * num)

    def __call__(self, image: Image.Image) -> list[Image.Image]:
        return [transform(image) for transform in self.transforms]

    def tensor_transform(self) -> Any:
        """The same crops from one image tensor (see :mod:`.tensor_path`)."""
        return multi_crop_twin(
            self.transforms, f"size_crops={self.size_crops}, num_crops={self.num_crops}"
        )

    def __repr__(self) -> str:
        return (
            f"ImgPilToMultiCrop(total_num_crops={self.total_num_crops}, "
            f"size_crops={self.size_crops}, num_crops={self.num_crops}, "
            f"crop_scales={self.crop_scales})"
        )

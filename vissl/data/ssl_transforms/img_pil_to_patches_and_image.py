"""``ImgPilToPatchesAndImage``: PIRL's two views of an image, a crop and its jigsaw patches.

PIRL (Misra & van der Maaten, CVPR 2020) compares the representation of an image with the
representation of a transformed version of it, the jigsaw transform: the image ``I`` gives

- a ``RandomResizedCrop`` of ``crop_size_image`` px (``crop_scale_image``): the image view;
- another ``RandomResizedCrop`` of ``crop_size_patches`` px (``crop_scale_patches``), cut
  into a ``sqrt(num_patches)`` grid of jittered patches (``ImgPatchesFromTensor``), put in
  a random order (``permute_patches``): the transformed view ``I^t``.

The output is a list of ``1 + num_patches`` PIL images, the image crop first (a "copies"
transform: later transforms such as colour jitter apply to every entry, and
``patch_and_image_collator`` batches them as the ``images`` and ``patches`` inputs).
Random draws come from torch's global generator, seeded per sample by the data set, so a
resumed run draws the same crops, offsets and orders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image

from vissl.data.ssl_transforms import register_transform
from vissl.data.ssl_transforms.img_patches_tensor import grid_patches, grid_side
from vissl.errors import ConfigError

_ARGS = (
    "crop_scale_image",
    "crop_size_image",
    "crop_scale_patches",
    "crop_size_patches",
    "permute_patches",
    "num_patches",
    "patch_jitter",
)


def _scale(value: Any, key: str) -> tuple[float, float]:
    ok = (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        and 0 < value[0] <= value[1] <= 1
    )
    if not ok:
        raise ConfigError(
            f"{key} must be [min, max] with 0 < min <= max <= 1 (the crop's share of the "
            f"image area), got {value!r}.",
            key,
        )
    return float(value[0]), float(value[1])


def _size(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer (pixels), got {value!r}.", key)
    return value


def _to_array(image: Image.Image) -> np.ndarray:
    """A PIL image as a ``(C, H, W)`` uint8 array (gray images get one channel)."""
    array = np.asarray(image)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def _to_pil(patch: np.ndarray, mode: str) -> Image.Image:
    array = np.ascontiguousarray(patch.transpose(1, 2, 0))
    return Image.fromarray(array[..., 0] if array.shape[2] == 1 else array, mode=mode)


@register_transform("ImgPilToPatchesAndImage")
class ImgPilToPatchesAndImage:
    """A PIL image to ``[image crop, patch_1, ..., patch_N]`` (module docstring).

    Args:
        crop_scale_image: scale range of the image crop (default ``(0.08, 1.0)``).
        crop_size_image: size of the image crop (default 224).
        crop_scale_patches: scale range of the crop cut into patches (default ``(0.6, 1)``).
        crop_size_patches: size of that crop (default 255, Jigsaw's).
        permute_patches: put the patches in a random order (default True).
        num_patches: a square number of patches (default 9).
        patch_jitter: each patch is this many pixels smaller than its grid cell
            (``ImgPatchesFromTensor``'s; default 21: 64 px patches from a 255 px crop).
    """

    ssl_transform_kind: ClassVar[str] = "copies"

    def __init__(
        self,
        crop_scale_image: Sequence[float] = (0.08, 1.0),
        crop_size_image: int = 224,
        crop_scale_patches: Sequence[float] = (0.6, 1.0),
        crop_size_patches: int = 255,
        permute_patches: bool = True,
        num_patches: int = 9,
        patch_jitter: int = 21,
        key_path: str = "ImgPilToPatchesAndImage",
    ) -> None:
        self.key_path = key_path
        self.side = grid_side(num_patches, f"{key_path}.num_patches")
        self.num_patches = num_patches
        size_patches = _size(crop_size_patches, f"{key_path}.crop_size_patches")
        if isinstance(patch_jitter, bool) or not isinstance(patch_jitter, int) or patch_jitter < 1:
            raise ConfigError(
                f"{key_path}.patch_jitter must be an integer >= 1, got {patch_jitter!r}.",
                f"{key_path}.patch_jitter",
            )
        if size_patches // self.side <= patch_jitter:
            raise ConfigError(
                f"{key_path}.patch_jitter: a {size_patches} px crop in a {self.side} x "
                f"{self.side} grid has {size_patches // self.side} px cells, no larger than "
                f"patch_jitter={patch_jitter}: raise crop_size_patches or lower patch_jitter.",
                f"{key_path}.patch_jitter",
            )
        self.patch_jitter = patch_jitter
        self.permute_patches = bool(permute_patches)
        self.crop_image = T.RandomResizedCrop(
            _size(crop_size_image, f"{key_path}.crop_size_image"),
            scale=_scale(crop_scale_image, f"{key_path}.crop_scale_image"),
        )
        self.crop_patches = T.RandomResizedCrop(
            size_patches, scale=_scale(crop_scale_patches, f"{key_path}.crop_scale_patches")
        )

    @classmethod
    def from_transform_config(
        cls, kwargs: Mapping[str, Any], key_path: str
    ) -> ImgPilToPatchesAndImage:
        unknown = sorted(set(kwargs) - set(_ARGS))
        if unknown:
            raise ConfigError(
                f"{key_path}: ImgPilToPatchesAndImage has no argument(s) {unknown}; it takes "
                f"{', '.join(_ARGS)}.",
                f"{key_path}.{unknown[0]}",
            )
        return cls(**kwargs, key_path=key_path)

    def __call__(self, image: Any) -> list[Image.Image]:
        if not isinstance(image, Image.Image):
            raise ConfigError(
                f"{self.key_path}: ImgPilToPatchesAndImage takes a PIL image (put it before "
                f"ToTensor); got {type(image).__name__}.",
                self.key_path,
            )
        cropped = self.crop_image(image)
        to_cut = self.crop_patches(image)
        arrays = grid_patches(_to_array(to_cut), self.side, self.patch_jitter, self.key_path)
        patches = [_to_pil(a, to_cut.mode) for a in arrays]
        if self.permute_patches:
            order = torch.randperm(self.num_patches).tolist()
            patches = [patches[i] for i in order]
        return [cropped, *patches]

    def __repr__(self) -> str:
        return (
            f"ImgPilToPatchesAndImage(image={self.crop_image.size[0]} px "
            f"{self.crop_image.scale}, patches={self.num_patches} of a "
            f"{self.crop_patches.size[0]} px crop {self.crop_patches.scale}, "
            f"patch_jitter={self.patch_jitter}, permute={self.permute_patches})"
        )

"""``ImgRotatePil``: RotNet's pretext transform, an image rotated by one of ``num_angles``
angles and the index of that angle as the sample's label.

RotNet (Gidaris, Singh, Komodakis, ICLR 2018) trains a classifier to tell which of the
rotations 0, 90, 180 and 270 degrees was applied. The angles are ``360 * k / num_angles``
for ``k = 0 .. num_angles - 1``, counter-clockwise (as ``torchvision``'s ``rotate``);
the label is ``k``.

Works on PIL images and on ``(C, H, W)`` tensors, so it can stand before or after
``ToTensor``; a quarter turn of a square tensor is an exact ``torch.rot90``. One random
rotation per image, as in VISSL; the paper's recipe, all ``num_angles`` rotations of
every image in the same batch, is ``rotnet_collator``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
import torchvision.transforms.functional as TF

from vissl.data.ssl_transforms import register_transform
from vissl.errors import ConfigError


def rotation_angles(num_angles: int) -> list[float]:
    """``[0, 360 / n, ..., 360 * (n - 1) / n]`` degrees."""
    return [360.0 * k / num_angles for k in range(num_angles)]


def rotate(image: Any, angle: float) -> Any:
    """``image`` turned counter-clockwise by ``angle`` degrees, keeping its size.

    Quarter turns of a square tensor are exact (``torch.rot90``); anything else goes
    through ``torchvision.transforms.functional.rotate`` (nearest, zero fill).
    """
    if isinstance(image, torch.Tensor) and image.shape[-1] == image.shape[-2]:
        quarter, rest = divmod(float(angle), 90.0)
        if rest == 0.0:
            return torch.rot90(image, int(quarter) % 4, dims=(-2, -1))
    return TF.rotate(image, float(angle))


def check_num_angles(value: Any, key: str) -> int:
    """A positive integer number of angles (at least 2), or a ConfigError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ConfigError(
            f"{key} must be an integer >= 2 (RotNet uses 4: 0, 90, 180, 270 degrees), "
            f"got {value!r}.",
            key,
        )
    return value


@register_transform("ImgRotatePil")
class ImgRotatePil:
    """Rotate by a random one of ``num_angles`` angles; the label is the angle's index.

    A "labels" transform: it returns ``(image, label)`` and the sample's label entry is
    replaced by ``label``.

    Args:
        num_angles: angles at equal steps in [0, 360) (default 4).
        num_rotations_per_img: must be 1 (VISSL's key); for all rotations of each image
            use ``rotnet_collator``.
    """

    ssl_transform_kind: ClassVar[str] = "labels"

    def __init__(
        self, num_angles: int = 4, num_rotations_per_img: int = 1, key_path: str = "ImgRotatePil"
    ) -> None:
        self.num_angles = check_num_angles(num_angles, f"{key_path}.num_angles")
        if num_rotations_per_img != 1:
            raise ConfigError(
                f"{key_path}.num_rotations_per_img must be 1 (as in VISSL), got "
                f"{num_rotations_per_img!r}; for all {num_angles} rotations of every image "
                "in the batch use COLLATE_FUNCTION: rotnet_collator instead.",
                f"{key_path}.num_rotations_per_img",
            )
        self.num_rotations_per_img = 1
        self.angles = rotation_angles(self.num_angles)

    @classmethod
    def from_transform_config(cls, kwargs: Mapping[str, Any], key_path: str) -> ImgRotatePil:
        unknown = sorted(set(kwargs) - {"num_angles", "num_rotations_per_img"})
        if unknown:
            raise ConfigError(
                f"{key_path}: ImgRotatePil has no argument(s) {unknown}; it takes "
                "num_angles and num_rotations_per_img.",
                f"{key_path}.{unknown[0]}",
            )
        return cls(**kwargs, key_path=key_path)

    def __call__(self, image: Any) -> tuple[Any, int]:
        label = int(torch.randint(self.num_angles, (1,)).item())
        return rotate(image, self.angles[label]), label

    def __repr__(self) -> str:
        return f"ImgRotatePil(num_angles={self.num_angles})"

"""``ImgPilToRawTensor``: a PIL image as a tensor of its raw pixel values."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vissl.data.ssl_transforms import register_transform


@register_transform("ImgPilToRawTensor")
class ImgPilToRawTensor:
    """Convert a PIL image to a ``(C, H, W)`` float32 tensor WITHOUT dividing by 255.

    As VISSL's ``ImgPilToRawTensor``: the same layout as ``ToTensor`` (channels first, one
    channel per PIL band, so ``L`` images give ``C = 1``) but the values stay the raw
    pixel values, 0..255 for 8-bit images, as float32. Use it when the normalization that
    follows expects 0..255 inputs (e.g. ``Normalize`` with ``mean: [123.675, 116.28,
    103.53]``, ``std: [58.395, 57.12, 57.375]``). No arguments.
    """

    def __call__(self, image: Any) -> torch.Tensor:
        array = np.array(image, copy=True)
        if array.ndim == 2:  # single-band image: (H, W) -> (H, W, 1)
            array = array[:, :, None]
        if array.ndim != 3:
            raise ValueError(
                f"ImgPilToRawTensor expects an image (H, W[, C]), got an array of shape "
                f"{array.shape}"
            )
        return torch.from_numpy(array).permute(2, 0, 1).contiguous().to(torch.float32)

    def __repr__(self) -> str:
        return "ImgPilToRawTensor()"

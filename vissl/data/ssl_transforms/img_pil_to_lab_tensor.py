"""``ImgPil2LabTensor``: an RGB image as a CIE Lab tensor, VISSL's input of colorization.

The output is a ``(3, H, W)`` float32 tensor in VISSL's scaling: channel 0 is ``L - 50``
(L in [0, 100], so [-50, 50]), channels 1 and 2 are ``a`` and ``b`` (roughly -86..98 and
-108..94 for sRGB colours). The ``alexnet_colorization`` trunk (MODEL.INPUT_TYPE: lab)
keeps channel 0, the lightness, as its input; colorization's target is channels 1-2, the
ab the ``colorization_collator`` hands to ``colorization_loss`` as the label.

VISSL converts with OpenCV's 8-bit ``COLOR_BGR2LAB`` (values rounded to integers, then
rescaled); here the conversion is exact, in floating point
(:func:`vissl.utils.lab_color.srgb_to_lab`, sRGB D65), so values differ from VISSL's by
the 8-bit rounding (under one unit of a or b; L by up to 0.2). No OpenCV is needed.
Accepts PIL images (gray ones are converted to RGB first: a = b = 0) and ``(3, H, W)``
tensors: floating ones with values in [0, 1] (after ``ToTensor``), ``uint8`` ones 0..255. No arguments (VISSL's ``indices``, as
for every transform, picks the views).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from vissl.data.ssl_transforms import register_transform
from vissl.utils.lab_color import srgb_to_lab

#: subtracted from L (VISSL's centring of the lightness)
L_OFFSET = 50.0


def rgb_to_vissl_lab(rgb: torch.Tensor) -> torch.Tensor:
    """``(..., 3, H, W)`` sRGB in [0, 1] -> Lab with L centred: ``(L - 50, a, b)``."""
    lab = srgb_to_lab(rgb.to(torch.float32))
    return torch.cat([lab[..., :1, :, :] - L_OFFSET, lab[..., 1:, :, :]], dim=-3)


@register_transform("ImgPil2LabTensor")
class ImgPil2LabTensor:
    """Convert an RGB image (PIL, or a ``(3, H, W)`` tensor in [0, 1]) to a Lab tensor
    ``(L - 50, a, b)`` of shape ``(3, H, W)``, float32 (see the module docstring)."""

    def __call__(self, image: Any) -> torch.Tensor:
        if isinstance(image, Image.Image):
            array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
            rgb = torch.from_numpy(array).permute(2, 0, 1)
        elif isinstance(image, torch.Tensor):
            if image.dim() != 3 or image.shape[0] != 3:
                raise ValueError(
                    "ImgPil2LabTensor expects a PIL image or a (3, H, W) RGB tensor in "
                    f"[0, 1]; got a tensor of shape {tuple(image.shape)}. Put it before "
                    "Normalize (it converts colours, not normalised values)."
                )
            # uint8 images are 0..255; floating ones are taken as ToTensor's 0..1
            rgb = image.to(torch.float32) / 255.0 if image.dtype == torch.uint8 else image.float()
        else:
            raise TypeError(
                f"ImgPil2LabTensor expects a PIL image or a tensor, got {type(image).__name__}"
            )
        return rgb_to_vissl_lab(rgb).contiguous()

    def __repr__(self) -> str:
        return "ImgPil2LabTensor()"

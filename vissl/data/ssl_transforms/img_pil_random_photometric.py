"""``ImgPilRandomPhotometric``: one random photometric operation, with probability ``p``."""

from __future__ import annotations

import torch
import torchvision.transforms.functional as F
from PIL import Image

from vissl.data.ssl_transforms import register_transform

#: the operations, one of which is drawn uniformly each time.
PHOTOMETRIC_OPS = (
    "brightness",
    "contrast",
    "saturation",
    "hue",
    "sharpness",
    "posterize",
    "solarize",
    "equalize",
    "autocontrast",
)


def apply_photometric_op(image: Image.Image, op: str, magnitude: float) -> Image.Image:
    """Apply ``op`` to ``image`` at ``magnitude`` in ``[0, 1)`` (see the class docstring)."""
    if op in ("brightness", "contrast", "saturation", "sharpness"):
        factor = 0.1 + 1.8 * magnitude  # PIL enhance factor in [0.1, 1.9]; 1 is identity
        adjust = {
            "brightness": F.adjust_brightness,
            "contrast": F.adjust_contrast,
            "saturation": F.adjust_saturation,
            "sharpness": F.adjust_sharpness,
        }[op]
        return adjust(image, factor)
    if op == "hue":
        return F.adjust_hue(image, 0.2 * magnitude - 0.1)  # shift in [-0.1, 0.1]
    if op == "posterize":
        return F.posterize(image, min(4 + int(5 * magnitude), 8))  # keep 4..8 bits
    if op == "solarize":
        return F.solarize(image, float(min(int(257 * magnitude), 256)))  # 256: unchanged
    if op == "equalize":
        return F.equalize(image)
    if op == "autocontrast":
        return F.autocontrast(image)
    raise ValueError(f"unknown photometric op {op!r}; expected one of {list(PHOTOMETRIC_OPS)}")


@register_transform("ImgPilRandomPhotometric")
class ImgPilRandomPhotometric:
    """With probability ``p``, apply one photometric operation drawn at random.

    As VISSL's ``ImgPilRandomPhotometric`` (the PIRL-style photometric augmentation,
    https://arxiv.org/abs/1912.01991): the operation is drawn uniformly from
    :data:`PHOTOMETRIC_OPS`, RandAugment-like, with a random magnitude:

    * brightness / contrast / saturation / sharpness: enhance factor in ``[0.1, 1.9]``;
    * hue: shift in ``[-0.1, 0.1]`` (no effect on single-band images);
    * posterize: keep 4 to 8 bits; solarize: threshold in 0..256 (256 leaves the image);
    * equalize, autocontrast: no magnitude.

    Every random number comes from torch's generator (like ``ImgPilRandomSolarize`` and
    ``ImgPilGaussianBlur``), which vissl seeds per data loader worker, so a run is
    reproducible; three numbers are drawn per call when the operation is applied, one
    when it is not. The image size and mode are kept.

    Args:
        p: probability of applying an operation (default 0.8).
    """

    def __init__(self, p: float = 0.8) -> None:
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a number in [0, 1], got {p!r}")
        self.p = float(p)

    def __call__(self, image: Image.Image) -> Image.Image:
        if torch.rand(()).item() >= self.p:
            return image
        op = PHOTOMETRIC_OPS[int(torch.randint(len(PHOTOMETRIC_OPS), ()).item())]
        magnitude = torch.rand(()).item()
        return apply_photometric_op(image, op, magnitude)

    def __repr__(self) -> str:
        return f"ImgPilRandomPhotometric(p={self.p})"

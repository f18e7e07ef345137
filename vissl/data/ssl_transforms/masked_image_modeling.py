"""Patch-masking transforms: ``RandomPatchMasking`` (MAE) and ``MaskedImageModeling``
(VISSL's name: iBOT's / BEiT's block-wise masking).

Each takes one image (a ``(C, H, W)`` tensor, or a PIL image) and returns VISSL's
"generalised" transform output ``{"data": image, "mask": mask}``: the image unchanged and a
boolean ``(H / patch_size, W / patch_size)`` mask, True = masked. The sample wrapper
appends the mask to ``sample["mask"]`` (one entry per transformed data entry), the
default collator stacks it into ``batch["mask"] = [Tensor(B, h, w)]``, and
``MODEL.MULTI_INPUT_HEAD_MAPPING``'s ``additional_keys: [mask]`` hands it to the trunk
(``MASKED_IMAGE_MODELING.NAME`` says what the trunk does with it)::

    DATA.TRAIN:
      INPUT_KEY_NAMES: [data, mask]
      TRANSFORMS: [..., {name: ToTensor}, {name: Normalize, ...},
                   {name: RandomPatchMasking, mask_ratio: 0.75, patch_size: 16}]
    MODEL.MULTI_INPUT_HEAD_MAPPING:
      [["data", {"feat_names": ["lastBLK"], "additional_keys": ["mask"]}]]

The masks are drawn from the global generators, which the data set seeds per sample from
(SEED_VALUE, epoch, index): a resumed run draws the same masks (:mod:`vissl.data.masking`).
Put the masking transform last (after ``ToTensor``/``Normalize``): it does not change the
image, and a later transform that makes copies would not copy the masks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from PIL import Image

from vissl.data.masking import block_mask, random_mask
from vissl.data.ssl_transforms import register_transform
from vissl.errors import ConfigError


def _image_size(image: Any) -> tuple[int, int]:
    if isinstance(image, torch.Tensor):
        return int(image.shape[-2]), int(image.shape[-1])
    if isinstance(image, Image.Image):
        return image.height, image.width
    raise TypeError(
        f"a masking transform takes a (C, H, W) tensor or a PIL image, got {type(image).__name__}."
    )


def _grid(image: Any, patch_size: int, name: str) -> tuple[int, int]:
    height, width = _image_size(image)
    if height % patch_size or width % patch_size:
        raise ConfigError(
            f"{name}: the image is {height}x{width} px, not a whole number of "
            f"{patch_size} px patches; make the crops a multiple of patch_size, which must "
            "equal the trunk's PATCH_SIZE.",
            "config.DATA.<split>.TRANSFORMS",
        )
    return height // patch_size, width // patch_size


def _check_args(kwargs: Mapping[str, Any], allowed: set[str], key_path: str, name: str) -> None:
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise ConfigError(
            f"{key_path}: {name} has no argument(s) {unknown}; it takes {sorted(allowed)}.",
            f"{key_path}.{unknown[0]}",
        )


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}.", key)
    return value


def _ratio(value: Any, key: str, *, closed: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not (0 <= value <= 1 if closed else 0 <= value < 1):
        interval = "[0, 1]" if closed else "[0, 1)"
        raise ConfigError(
            f"{key} must be a number in {interval} (the fraction of patches masked), "
            f"got {value!r}.",
            key,
        )
    return float(value)


@register_transform("RandomPatchMasking")
class RandomPatchMasking:
    """MAE's random masking: ``mask_ratio`` of the patches, chosen uniformly per image.

    Every image of a given size hides the same number of patches,
    ``L - int(L * (1 - mask_ratio))`` of ``L``, so the visible patches batch together.

    Args:
        mask_ratio: the fraction of patches masked, in [0, 1) (MAE: 0.75).
        patch_size: the patch side in pixels; must equal the trunk's PATCH_SIZE.
    """

    def __init__(
        self,
        mask_ratio: float = 0.75,
        patch_size: int = 16,
        key_path: str = "RandomPatchMasking",
    ) -> None:
        self.mask_ratio = _ratio(mask_ratio, f"{key_path}.mask_ratio")
        self.patch_size = _positive_int(patch_size, f"{key_path}.patch_size")

    @classmethod
    def from_transform_config(cls, kwargs: Mapping[str, Any], key_path: str) -> RandomPatchMasking:
        _check_args(kwargs, {"mask_ratio", "patch_size"}, key_path, "RandomPatchMasking")
        return cls(**kwargs, key_path=key_path)

    def __call__(self, image: Any) -> dict[str, Any]:
        grid = _grid(image, self.patch_size, "RandomPatchMasking")
        return {"data": image, "mask": random_mask(grid, self.mask_ratio)}

    def __repr__(self) -> str:
        return f"RandomPatchMasking(mask_ratio={self.mask_ratio}, patch_size={self.patch_size})"


def _float_list(value: Any, key: str) -> list[float]:
    items = [value] if isinstance(value, int | float) else value
    if (
        not isinstance(items, Sequence)
        or isinstance(items, str)
        or not items
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in items)
    ):
        raise ConfigError(f"{key} must be a non-empty list of numbers, got {value!r}.", key)
    return [float(v) for v in items]


@register_transform("MaskedImageModeling")
class MaskedImageModeling:
    """Block-wise masking (BEiT; iBOT's ``pred_shape: block``), VISSL's transform name and keys.

    Per image, one of the ``pred_ratio_mean`` entries is picked uniformly (index ``i``),
    the ratio drawn uniformly in ``mean_i +- var_i`` (exactly ``mean_i`` if ``var_i`` is 0),
    and :func:`~vissl.data.masking.block_mask` covers ``int(L * ratio)`` of the ``L``
    patches with rectangles (a few less when the rectangles cannot fill the target).

    Args:
        pred_ratio_mean: the mean masking ratios (iBOT: [0.3]; VISSL's iBOT configs also
            [0.0, 0.3], which leaves some images unmasked).
        pred_ratio_var: their half-widths, one per mean (iBOT: [0.2]).
        patch_size: the patch side in pixels; must equal the trunk's PATCH_SIZE.
        log_aspect_ratio: the range of the rectangles' aspect ratios (height / width), as
            ratios (VISSL's key: ``[0.3, 3.33]``); their logs are drawn uniformly.
        min_num_patches: the smallest rectangle area; null: ``(min(h, w) // 3) ** 2``.
    """

    def __init__(
        self,
        pred_ratio_mean: Sequence[float] | float = (0.3,),
        pred_ratio_var: Sequence[float] | float = (0.0,),
        patch_size: int = 16,
        log_aspect_ratio: Sequence[float] = (0.3, 1 / 0.3),
        min_num_patches: int | None = None,
        key_path: str = "MaskedImageModeling",
    ) -> None:
        self.pred_ratio_mean = _float_list(pred_ratio_mean, f"{key_path}.pred_ratio_mean")
        self.pred_ratio_var = _float_list(pred_ratio_var, f"{key_path}.pred_ratio_var")
        if len(self.pred_ratio_var) != len(self.pred_ratio_mean):
            raise ConfigError(
                f"{key_path}.pred_ratio_var needs one entry per pred_ratio_mean entry "
                f"({len(self.pred_ratio_mean)}), got {len(self.pred_ratio_var)}.",
                f"{key_path}.pred_ratio_var",
            )
        for mean, var in zip(self.pred_ratio_mean, self.pred_ratio_var):
            _ratio(mean - var, f"{key_path}.pred_ratio_mean - pred_ratio_var", closed=True)
            _ratio(mean + var, f"{key_path}.pred_ratio_mean + pred_ratio_var", closed=True)
        self.patch_size = _positive_int(patch_size, f"{key_path}.patch_size")
        ratios = _float_list(log_aspect_ratio, f"{key_path}.log_aspect_ratio")
        if len(ratios) != 2 or not 0 < ratios[0] <= ratios[1]:
            raise ConfigError(
                f"{key_path}.log_aspect_ratio must be two aspect ratios [low, high] with "
                f"0 < low <= high (iBOT: [0.3, 3.33]), got {list(log_aspect_ratio)!r}.",
                f"{key_path}.log_aspect_ratio",
            )
        self.log_aspect_ratio = (math.log(ratios[0]), math.log(ratios[1]))
        self.min_num_patches = (
            None
            if min_num_patches is None
            else _positive_int(min_num_patches, f"{key_path}.min_num_patches")
        )

    @classmethod
    def from_transform_config(cls, kwargs: Mapping[str, Any], key_path: str) -> MaskedImageModeling:
        allowed = {
            "pred_ratio_mean",
            "pred_ratio_var",
            "patch_size",
            "log_aspect_ratio",
            "min_num_patches",
        }
        _check_args(kwargs, allowed, key_path, "MaskedImageModeling")
        return cls(**kwargs, key_path=key_path)

    def draw_ratio(self) -> float:
        """One image's masking ratio (see the class docstring)."""
        i = int(torch.randint(len(self.pred_ratio_mean), ()))
        mean, var = self.pred_ratio_mean[i], self.pred_ratio_var[i]
        if var <= 0:
            return mean
        return mean - var + 2 * var * float(torch.rand(()))

    def __call__(self, image: Any) -> dict[str, Any]:
        grid = _grid(image, self.patch_size, "MaskedImageModeling")
        num_masked = int(grid[0] * grid[1] * self.draw_ratio())
        mask = block_mask(grid, num_masked, self.min_num_patches, self.log_aspect_ratio)
        return {"data": image, "mask": mask}

    def __repr__(self) -> str:
        return (
            f"MaskedImageModeling(pred_ratio_mean={self.pred_ratio_mean}, "
            f"pred_ratio_var={self.pred_ratio_var}, patch_size={self.patch_size})"
        )

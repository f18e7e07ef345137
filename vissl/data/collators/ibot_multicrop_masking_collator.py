"""``ibot_multicrop_masking_collator``: iBOT's multi-crop batch with the global crops' masks
(VISSL's name and layout; DINOv2 uses it too).

Each sample holds ``K`` crops (``ImgPilToMultiCrop``) and a patch mask per crop (the
``MaskedImageModeling`` transform, last in the chain, masks every crop; or only the global
ones when its ``indices`` select them). The crops of the largest size are the global crops
(``G``, iBOT: 2), the others the local crops (one size). Output, for ``B`` samples, every
tensor crop-major (crop 0 of every sample, then crop 1, ...)::

    {"global_views": [Tensor(G * B, C, H, W)],
     "local_views": [Tensor((K - G) * B, C, h, w)],   # absent without local crops
     "mask": [Tensor(G * B, H / p, W / p) bool],      # the global crops' masks
     "label": [Tensor(K * B)], "data_valid": [Tensor(K * B)], "data_idx": [Tensor(K * B)]}

The data set seeds each sample's transforms from (SEED_VALUE, epoch, index), so the crops
and the masks are the same after a resume and with any number of workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vissl.data.collators import register_collator
from vissl.data.collators._common import as_tensor, check_batch, check_tensor_data, view_major
from vissl.errors import ConfigError

_KEY = "config.DATA.<split>.COLLATE_FUNCTION"


def _global_crops(sizes: list[tuple[int, ...]]) -> list[int]:
    largest = max(size[-2] * size[-1] for size in sizes)
    return [k for k, size in enumerate(sizes) if size[-2] * size[-1] == largest]


@register_collator("ibot_multicrop_masking_collator")
def ibot_multicrop_masking_collator(batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Collate ``B`` samples of ``K`` crops and their masks (see the module docstring).

    Raises:
        ConfigError: the samples have no masks, or not one per crop (or per global crop),
            or the local crops differ in size.
    """
    name = "ibot_multicrop_masking_collator"
    num_crops = check_batch(batch, name)
    check_tensor_data(batch, name)
    if "mask" not in batch[0]:
        raise ConfigError(
            f"{name}: the samples have no 'mask'; end config.DATA.TRAIN.TRANSFORMS with "
            "{name: MaskedImageModeling, pred_ratio_mean: [...], pred_ratio_var: [...], "
            "patch_size: <the trunk's PATCH_SIZE>}.",
            _KEY,
        )
    sizes = [tuple(as_tensor(crop).shape) for crop in batch[0]["data"]]
    global_idx = _global_crops(sizes)
    local_idx = [k for k in range(num_crops) if k not in global_idx]
    if len({sizes[k] for k in local_idx}) > 1:
        raise ConfigError(
            f"{name}: the local crops have several sizes {sorted({sizes[k] for k in local_idx})}; "
            "iBOT batches them as one tensor, so give them one size in ImgPilToMultiCrop.",
            _KEY,
        )
    num_masks = len(batch[0]["mask"])
    if num_masks == num_crops:
        mask_of = {k: k for k in global_idx}
    elif num_masks == len(global_idx):
        mask_of = {k: i for i, k in enumerate(global_idx)}
    else:
        raise ConfigError(
            f"{name}: each sample has {num_masks} masks for {num_crops} crops "
            f"({len(global_idx)} global): the masking transform must come after "
            "ImgPilToMultiCrop and mask every crop, or the global crops only.",
            _KEY,
        )

    def stack(crops: list[int], key: str, slot: dict[int, int] | None = None) -> torch.Tensor:
        return torch.stack(
            [
                as_tensor(sample[key][k if slot is None else slot[k]])
                for k in crops
                for sample in batch
            ]
        )

    output: dict[str, Any] = {
        "global_views": [stack(global_idx, "data")],
        "mask": [stack(global_idx, "mask", mask_of).bool()],
    }
    if local_idx:
        output["local_views"] = [stack(local_idx, "data")]
    for key in ("label", "data_valid", "data_idx"):
        output[key] = [view_major(batch, key, num_crops)]
    return output

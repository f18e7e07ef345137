"""``patch_and_image_collator``: PIRL's batch of image crops and their jigsaw patches.

Each sample's data (from ``ImgPilToPatchesAndImage`` and later transforms) is
``[image, patch_1, ..., patch_N]``. The batch has two inputs, named as VISSL's PIRL
configs name them in ``DATA.TRAIN.INPUT_KEY_NAMES: [patches, images]``::

    {"images":  [Tensor(B, C, H, W)],        # the image crops
     "patches": [Tensor(B * N, C, h, w)],    # sample-major: rows i*N .. i*N+N-1 are sample i's
     "label": [Tensor(B)], "data_valid": [Tensor(B)], "data_idx": [Tensor(B)]}

so the trunk sees every patch as an image and ``siamese_concat_view`` (``num_towers: N``)
in the patch head puts each sample's ``N`` features back together. The label is the
sample's first label entry (its index with ``LABEL_TYPE: sample_index``: the memory bank's
entry).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vissl.data.collators import register_collator
from vissl.data.collators._common import as_tensor, check_batch, check_tensor_data
from vissl.errors import ConfigError

_NAME = "patch_and_image_collator"


@register_collator(_NAME)
def patch_and_image_collator(batch: Sequence[dict[str, Any]]) -> dict[str, list[torch.Tensor]]:
    """Collate samples of ``[image, patch_1, ..., patch_N]`` (module docstring).

    Raises:
        ConfigError: a sample has fewer than 2 data entries (the transforms did not make
            an image and its patches), or the entries are not tensors of one shape each.
    """
    num_entries = check_batch(batch, _NAME)
    if num_entries < 2:
        raise ConfigError(
            f"{_NAME}: every sample needs an image and its patches (start "
            "config.DATA.<split>.TRANSFORMS with ImgPilToPatchesAndImage); got "
            f"{num_entries} data entry per sample.",
            "config.DATA.<split>.TRANSFORMS",
        )
    check_tensor_data(batch, _NAME)
    try:
        images = torch.stack([as_tensor(sample["data"][0]) for sample in batch])
        patches = torch.stack(
            [as_tensor(patch) for sample in batch for patch in sample["data"][1:]]
        )
    except RuntimeError as err:
        raise ConfigError(
            f"{_NAME}: the images (or the patches) differ in shape between samples ({err}); "
            "crop them to one size (ImgPilToPatchesAndImage's crop_size_image and "
            "crop_size_patches).",
            "config.DATA.<split>.TRANSFORMS",
        ) from None

    def first(key: str) -> torch.Tensor:
        return torch.stack([as_tensor(sample[key][0]).reshape(()) for sample in batch])

    return {
        "images": [images],
        "patches": [patches],
        "label": [first("label")],
        "data_valid": [first("data_valid")],
        "data_idx": [first("data_idx")],
    }

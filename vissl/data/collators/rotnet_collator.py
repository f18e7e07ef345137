"""``rotnet_collator``: every image of the batch in each of ``num_angles`` rotations,
labelled with the rotation's index (RotNet's recipe: Gidaris et al. 2018, section 2.2,
feed all four rotations of an image together)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vissl.data.collators import register_collator
from vissl.data.collators._common import check_batch, check_tensor_data, view_major
from vissl.data.ssl_transforms.img_rotate_pil import check_num_angles, rotate, rotation_angles

_KEY = "config.DATA.<split>.COLLATE_FUNCTION_PARAMS.num_angles"


@register_collator("rotnet_collator")
def rotnet_collator(
    batch: Sequence[dict[str, Any]], num_angles: int = 4
) -> dict[str, list[torch.Tensor]]:
    """Collate ``B`` samples of ``V`` views into ``num_angles * V * B`` rotated images.

    Output (``R = num_angles``, rotation-major; each rotation block is view-major like
    ``simclr_collator``)::

        {"data": [Tensor(R * V * B, C, H, W)],
         "label": [Tensor(R * V * B)],        # the rotation index r of each row
         "data_valid": [...], "data_idx": [...]}  # repeated per rotation

    so row ``r * V * B + v * B + i`` is view ``v`` of sample ``i`` turned by
    ``360 * r / R`` degrees counter-clockwise. The samples' own labels are not used.

    Raises:
        ConfigError: ``num_angles`` is not an integer >= 2, or the images are not tensors.
    """
    check_num_angles(num_angles, _KEY)
    num_views = check_batch(batch, "rotnet_collator")
    check_tensor_data(batch, "rotnet_collator")
    images = view_major(batch, "data", num_views)
    rows = images.shape[0]
    data = torch.cat([rotate(images, angle) for angle in rotation_angles(num_angles)])
    label = torch.arange(num_angles).repeat_interleave(rows)
    valid = view_major(batch, "data_valid", num_views).repeat(num_angles)
    index = view_major(batch, "data_idx", num_views).repeat(num_angles)
    return {"data": [data], "label": [label], "data_valid": [valid], "data_idx": [index]}

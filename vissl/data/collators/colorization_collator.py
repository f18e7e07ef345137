"""``colorization_collator``: Lab images as the input, their ab channels as the label.

Colorization's input/target split: the model gets the whole Lab tensor of
``ImgPil2LabTensor`` (its trunk, ``alexnet_colorization`` with MODEL.INPUT_TYPE: lab,
keeps L only, as in VISSL) and ``colorization_loss`` gets the a and b channels as the
target. vissl's own collator (VISSL ships no colorization training).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vissl.data.collators import register_collator
from vissl.data.collators._common import check_batch, check_tensor_data, view_major
from vissl.errors import ConfigError


@register_collator("colorization_collator")
def colorization_collator(batch: Sequence[dict[str, Any]]) -> dict[str, list[torch.Tensor]]:
    """Collate ``B`` samples of ``V`` Lab views, view-major like ``simclr_collator``::

        {"data": [Tensor(V * B, 3, H, W)],    # (L - 50, a, b)
         "label": [Tensor(V * B, 2, H, W)],   # (a, b): the target
         "data_valid": [...], "data_idx": [...]}

    The samples' own labels are not used.

    Raises:
        ConfigError: the images are not 3-channel tensors (TRANSFORMS must end with
            ImgPil2LabTensor).
    """
    num_views = check_batch(batch, "colorization_collator")
    check_tensor_data(batch, "colorization_collator")
    data = view_major(batch, "data", num_views)
    if data.dim() != 4 or data.shape[1] != 3 or not data.is_floating_point():
        key = "config.DATA.<split>.TRANSFORMS"
        raise ConfigError(
            f"colorization_collator: the images must be Lab tensors (3, H, W) from "
            f"ImgPil2LabTensor; got a batch of shape {tuple(data.shape)} ({data.dtype}). "
            f"End {key} with {{name: ImgPil2LabTensor}}.",
            key,
        )
    return {
        "data": [data],
        "label": [data[:, 1:3].clone()],
        "data_valid": [view_major(batch, "data_valid", num_views)],
        "data_idx": [view_major(batch, "data_idx", num_views)],
    }

"""``siamese_collator``: samples of ``T`` patches each become one batch of ``B * T``
images, so the trunk sees every patch as an image (Jigsaw's siamese towers share their
weights, as VISSL's do; ``siamese_concat_view`` in the head puts each sample's ``T``
features back together)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vissl.data.collators import register_collator
from vissl.data.collators._common import as_tensor, check_batch, view_major
from vissl.errors import ConfigError

_KEY = "config.DATA.<split>.COLLATE_FUNCTION"


def _towers(batch: Sequence[dict[str, Any]], num_views: int) -> list[torch.Tensor]:
    """Each sample's data entries as ``(T, C, H, W)`` tensors, view-major."""
    stacks = []
    for view in range(num_views):
        for sample in batch:
            entry = sample["data"][view]
            if isinstance(entry, list | tuple):
                entry = torch.stack([as_tensor(x) for x in entry])
            if not isinstance(entry, torch.Tensor) or entry.ndim != 4:
                got = tuple(entry.shape) if isinstance(entry, torch.Tensor) else type(entry)
                raise ConfigError(
                    "siamese_collator: every data entry must be a (num_towers, C, H, W) "
                    f"tensor of patches (end DATA.<split>.TRANSFORMS with "
                    f"ImgPatchesFromTensor and ShuffleImgPatches); got {got}.",
                    "config.DATA.<split>.TRANSFORMS",
                )
            stacks.append(entry)
    if len({t.shape for t in stacks}) != 1:
        raise ConfigError(
            "siamese_collator: the samples' patch stacks differ in shape "
            f"({sorted({tuple(t.shape) for t in stacks})}); every image must give the same "
            "number and size of patches (crop the images to one size first).",
            _KEY,
        )
    return stacks


@register_collator("siamese_collator")
def siamese_collator(batch: Sequence[dict[str, Any]]) -> dict[str, list[torch.Tensor]]:
    """Collate ``B`` samples whose data entries hold ``T`` patches into ``V * B * T`` rows.

    Output (``V`` data entries per sample, usually 1; view-major like
    ``simclr_collator``)::

        {"data": [Tensor(V * B * T, C, H, W)],
         "label": [Tensor(V * B)],           # one label per image (the permutation index)
         "data_valid": [Tensor(V * B)], "data_idx": [Tensor(V * B)]}

    so rows ``(v * B + i) * T .. (v * B + i) * T + T - 1`` are the ``T`` patches of view
    ``v`` of sample ``i``, in their (shuffled) order. A label that holds one value per
    image (an int or VISSL's ``LongTensor([index])``) becomes one entry per image.

    Raises:
        ConfigError: a data entry is not a ``(T, C, H, W)`` stack of patches, or the
            samples' stacks differ in shape.
    """
    num_views = check_batch(batch, "siamese_collator")
    stacks = _towers(batch, num_views)
    data = torch.cat(stacks)
    labels = [as_tensor(sample["label"][v]) for v in range(num_views) for sample in batch]
    label = torch.stack([x.reshape(-1) for x in labels])
    if label.shape[1] == 1:
        label = label[:, 0]
    valid = view_major(batch, "data_valid", num_views)
    index = view_major(batch, "data_idx", num_views)
    return {"data": [data], "label": [label], "data_valid": [valid], "data_idx": [index]}

"""``targets_one_hot_default_collator``: multi-label targets as ``(B, num_classes)`` rows.

Each row holds 1 for a positive class, 0 for a negative one and -1 for a class the sample
says nothing about (ignored by ``bce_logits_multiple_output_single_target`` and the
mean-AP meters). A sample's label is either

- VISSL's pair ``[positive classes, negative classes]`` (two lists of class indices, e.g.
  from ``LABEL_PATHS: [[pos.npy, neg.npy]]``, OpenImages style): unnamed classes are -1;
- or a ready multi-hot row of ``num_classes`` values in {1, 0, -1} (a numeric array, as a
  VOC07 ``(N, C)`` label file gives): kept as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vissl.data.collators import register_collator
from vissl.data.collators._common import as_tensor, check_tensor_data
from vissl.errors import ConfigError

_KEY = "config.DATA.<split>.COLLATE_FUNCTION_PARAMS"


def _indices(value: Any, num_classes: int, which: str) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int | np.integer):
        items = [int(value)]
    else:
        items = [int(v) for v in np.asarray(value).reshape(-1).tolist()]
    bad = [i for i in items if not 0 <= i < num_classes]
    if bad:
        raise ConfigError(
            f"targets_one_hot_default_collator: {which} class index {bad[0]} is outside "
            f"[0, {num_classes}); set {_KEY}.num_classes to the number of classes.",
            f"{_KEY}.num_classes",
        )
    return items


def convert_to_one_hot(pos_lbl: Any, neg_lbl: Any, num_classes: int) -> torch.Tensor:
    """The ``(num_classes,)`` row of one sample: 1 at ``pos_lbl``, 0 at ``neg_lbl``, else -1.

    A class listed as both positive and negative ends up negative (VISSL's order).
    """
    row = torch.full((num_classes,), -1, dtype=torch.long)
    pos = _indices(pos_lbl, num_classes, "positive")
    neg = _indices(neg_lbl, num_classes, "negative")
    if pos:
        row[pos] = 1
    if neg:
        row[neg] = 0
    return row


def _is_multi_hot(label: Any, num_classes: int) -> bool:
    if isinstance(label, torch.Tensor):
        return label.ndim == 1 and label.shape[0] == num_classes and not label.is_floating_point()
    if isinstance(label, np.ndarray):
        return label.ndim == 1 and label.shape[0] == num_classes and label.dtype.kind in "iub"
    return False


def _row(label: Any, num_classes: int) -> torch.Tensor:
    if _is_multi_hot(label, num_classes):
        row = as_tensor(label).to(torch.long)
        if not bool(((row >= -1) & (row <= 1)).all()):
            raise ValueError(
                "targets_one_hot_default_collator: a multi-hot label row must hold 1, 0 or -1."
            )
        return row
    if isinstance(label, list | tuple | np.ndarray) and len(label) == 2:
        return convert_to_one_hot(label[0], label[1], num_classes)
    raise ValueError(
        "targets_one_hot_default_collator: each label must be [positive classes, negative "
        f"classes] or a multi-hot row of {num_classes} values; got {label!r}."
    )


@register_collator("targets_one_hot_default_collator")
def targets_one_hot_default_collator(
    batch: Sequence[dict[str, Any]], num_classes: int = 0
) -> dict[str, list[torch.Tensor]]:
    """Collate one data source with multi-label targets.

    Output::

        {"data": [Tensor(B, C, H, W)], "label": [LongTensor(B, num_classes)],
         "data_valid": [Tensor(B)], "data_idx": [Tensor(B)]}

    Raises:
        ConfigError: ``num_classes`` missing, several data sources, or a class index out of
            range.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes <= 0:
        raise ConfigError(
            "targets_one_hot_default_collator needs the number of classes: set "
            f"{_KEY}.num_classes (e.g. {{num_classes: 20}} for VOC07), got {num_classes!r}.",
            f"{_KEY}.num_classes",
        )
    if not batch:
        raise ValueError("targets_one_hot_default_collator: cannot collate an empty batch")
    for key in ("data", "label", "data_valid", "data_idx"):
        if key not in batch[0]:
            raise ConfigError(
                f"targets_one_hot_default_collator: the samples have no {key!r} key.",
                "config.DATA.<split>.COLLATE_FUNCTION",
            )
    if len(batch[0]["data"]) != 1:
        raise ConfigError(
            "targets_one_hot_default_collator supports one data source; got "
            f"{len(batch[0]['data'])}. Use default_collate for several.",
            "config.DATA.<split>.DATA_SOURCES",
        )
    check_tensor_data(batch, "targets_one_hot_default_collator")
    data = torch.stack([as_tensor(s["data"][0]) for s in batch])
    labels = torch.stack([_row(s["label"][0], num_classes) for s in batch])
    valid = torch.stack([as_tensor(s["data_valid"][0]) for s in batch])
    index = torch.stack([as_tensor(s["data_idx"][0]) for s in batch])
    return {"data": [data], "label": [labels], "data_valid": [valid], "data_idx": [index]}

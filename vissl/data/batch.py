"""Batch helpers shared by train steps and engines: VISSL's sample layout, device moves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from vissl.errors import ConfigError

__all__ = ["construct_sample_for_model", "move_to_device", "to_channels_last"]


def move_to_device(obj: Any, device: torch.device) -> Any:
    """Copy tensors (nested in lists/tuples/dicts) to ``device`` without blocking."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, Mapping):
        return {k: move_to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(move_to_device(v, device) for v in obj)
    return obj


def to_channels_last(obj: Any) -> Any:
    """4-D image tensors (also in lists) to the channels_last memory format."""
    if isinstance(obj, torch.Tensor):
        return obj.contiguous(memory_format=torch.channels_last) if obj.dim() == 4 else obj
    if isinstance(obj, list | tuple):
        return type(obj)(to_channels_last(v) for v in obj)
    return obj


def construct_sample_for_model(batch: Mapping[str, Any], task: Any) -> dict[str, Any]:
    """Reshape a collated batch into ``{"input", "target", "data_valid", ...}`` (VISSL's rule).

    Each input/target key holds a list with one entry per data source; one source is
    supported by the standard step. With one input key, ``sample["input"]`` is that entry;
    with several (e.g. PIRL), ``sample["input"][key]``. Other keys are copied unchanged.
    """
    input_keys = task.data_and_label_keys["input"]
    target_keys = task.data_and_label_keys["target"]
    for key in (*input_keys, *target_keys):
        if key not in batch:
            raise ConfigError(
                f"the batch has no key {key!r} (keys: {sorted(batch)}). Check "
                "config.DATA.<split>.INPUT_KEY_NAMES / TARGET_KEY_NAMES and the collator.",
                "config.DATA.TRAIN.INPUT_KEY_NAMES",
            )
        value = batch[key]
        if not isinstance(value, list) or len(value) != 1:
            raise ConfigError(
                f"batch[{key!r}] must be a list with one entry per data source, and the "
                f"standard train step supports one data source (got "
                f"{type(value).__name__} of length {len(value) if isinstance(value, list) else '-'}). "
                "Use one entry in config.DATA.<split>.DATA_SOURCES or write a train step "
                "that handles several.",
                "config.DATA.TRAIN.DATA_SOURCES",
            )
    sample: dict[str, Any] = {}
    if len(input_keys) == 1:
        sample["input"] = batch[input_keys[0]][0]
    else:
        sample["input"] = {k: batch[k][0] for k in input_keys}
    if len(target_keys) == 1:
        sample["target"] = batch[target_keys[0]][0]
    else:
        sample["target"] = {k: batch[k][0] for k in target_keys}
    if "data_valid" in batch:
        sample["data_valid"] = batch["data_valid"][0]
    for key, value in batch.items():
        if (
            key not in sample
            and key not in input_keys
            and key not in target_keys
            and key != "data_valid"
        ):
            sample[key] = value
    return sample

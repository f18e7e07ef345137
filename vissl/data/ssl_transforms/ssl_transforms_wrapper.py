"""Building ``DATA.<split>.TRANSFORMS`` into one callable on VISSL's sample dicts.

The wrappers that apply a transform to a sample dict (``SSLTransformsWrapper``,
``SSLTransformsCompose``, the transform kinds) live in
:mod:`~vissl.data.ssl_transforms.sample_wrapper` and are importable from here as well.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vissl.data.ssl_transforms.sample_wrapper import (
    KINDS,
    TENSOR_PATH_START,
    TRANSFORMS_WITH_COPIES,
    TRANSFORMS_WITH_ENTIRE_SAMPLE,
    TRANSFORMS_WITH_GROUPING,
    TRANSFORMS_WITH_LABELS,
    SSLTransformsCompose,
    SSLTransformsWrapper,
    transform_kind,
)
from vissl.data.ssl_transforms.tensor_path import plan_tensor_path
from vissl.errors import ConfigError

__all__ = [
    "KINDS",
    "TENSOR_PATH_START",
    "TRANSFORMS_WITH_COPIES",
    "TRANSFORMS_WITH_ENTIRE_SAMPLE",
    "TRANSFORMS_WITH_GROUPING",
    "TRANSFORMS_WITH_LABELS",
    "SSLTransformsCompose",
    "SSLTransformsWrapper",
    "build_transforms",
    "transform_kind",
]


def build_transforms(
    transforms_cfg: Sequence[Mapping[str, Any]] | None,
    split: str = "TRAIN",
    tensor_path: bool = True,
) -> SSLTransformsCompose:
    """Build ``DATA.<split>.TRANSFORMS`` into one callable on sample dicts.

    Args:
        transforms_cfg: the list of transform entries.
        split: ``"TRAIN"`` or ``"TEST"``, for error messages.
        tensor_path: run the transforms before ``ToTensor`` on tensors where they can
            (:func:`~vissl.data.ssl_transforms.tensor_path.plan_tensor_path`): the same
            random parameters and operations, faster; False keeps PIL images throughout.

    Raises:
        ConfigError: the list or one entry is malformed (the message names
            ``config.DATA.<split>.TRANSFORMS[i]``).
        UnknownNameError: an unknown transform name.
    """
    base = f"config.DATA.{split}.TRANSFORMS"
    if transforms_cfg is None:
        return SSLTransformsCompose([])
    if isinstance(transforms_cfg, Mapping | str) or not isinstance(transforms_cfg, Sequence):
        raise ConfigError(f"{base} must be a list of transform entries.", base)
    wrappers = [
        SSLTransformsWrapper.from_config(entry, key_path=f"{base}[{i}]")
        for i, entry in enumerate(transforms_cfg)
    ]
    if tensor_path:
        wrappers = plan_tensor_path(wrappers)
    return SSLTransformsCompose(wrappers)

"""Transforms: ``@register_transform(name)``; every torchvision transform works by name too.

Selected by ``DATA.<split>.TRANSFORMS: [{name: ..., indices: [...], <kwargs>}]``. Each
entry is built as ``cls(**kwargs)`` and wrapped in :class:`SSLTransformsWrapper`, which
applies it to the entries of ``sample["data"]`` listed in ``indices`` (all if omitted).
A name that is not registered is looked up in ``torchvision.transforms`` (also in
title case, so ``random_horizontal_flip`` finds ``RandomHorizontalFlip``).

By default the transforms before ``ToTensor`` run on tensors, with the same random draws
and operations as on PIL images (:mod:`vissl.data.ssl_transforms.tensor_path`).
"""

from __future__ import annotations

from vissl.data.ssl_transforms.registry import (
    TRANSFORM_REGISTRY,
    get_transform,
    register_transform,
)
from vissl.utils.imports import import_submodules

import_submodules(__name__)

from vissl.data.ssl_transforms.ssl_transforms_wrapper import (  # noqa: E402
    SSLTransformsCompose,
    SSLTransformsWrapper,
    build_transforms,
)

__all__ = [
    "TRANSFORM_REGISTRY",
    "SSLTransformsCompose",
    "SSLTransformsWrapper",
    "build_transforms",
    "get_transform",
    "register_transform",
]

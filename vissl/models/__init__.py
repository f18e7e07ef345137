"""Models: a trunk (``vissl.models.trunks``) plus heads (``vissl.models.heads``).

``build_model(config.MODEL, config.OPTIMIZER)`` builds the model named by
MODEL.BASE_MODEL_NAME (default ``multi_input_output_model``, i.e.
:class:`~vissl.models.base_ssl_model.BaseSSLMultiInputOutputModel`). Register another
model class with ``@register_model(name)``; it is constructed as
``cls(model_config, optimizer_config)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn as nn

from vissl.utils.registry import Registry

MODEL_REGISTRY: Registry[Any] = Registry("model", config_key="config.MODEL.BASE_MODEL_NAME")

DEFAULT_MODEL_NAME = "multi_input_output_model"


def register_model(name: str) -> Any:
    """Decorator registering a model class under ``name`` (selected by MODEL.BASE_MODEL_NAME)."""
    return MODEL_REGISTRY.register(name)


def get_model(name: str) -> Any:
    """The model class registered as ``name``.

    Raises:
        UnknownNameError: nothing is registered under ``name`` (lists the names).
    """
    return MODEL_REGISTRY.get(name)


def build_model(model_config: Mapping[str, Any], optimizer_config: Mapping[str, Any]) -> nn.Module:
    """Build the model named by MODEL.BASE_MODEL_NAME from config.MODEL and config.OPTIMIZER."""
    name = model_config.get("BASE_MODEL_NAME", DEFAULT_MODEL_NAME) or DEFAULT_MODEL_NAME
    return get_model(name)(model_config, optimizer_config)


# Registrations: trunks, heads, then the models that use them.
from vissl.models import heads, trunks  # noqa: E402
from vissl.models.base_ssl_model import BaseSSLMultiInputOutputModel  # noqa: E402
from vissl.models.model_helpers import convert_sync_bn, model_output_has_nan  # noqa: E402
from vissl.models.trunks.feature_extractor import FeatureExtractorModel  # noqa: E402

__all__ = [
    "DEFAULT_MODEL_NAME",
    "MODEL_REGISTRY",
    "BaseSSLMultiInputOutputModel",
    "FeatureExtractorModel",
    "build_model",
    "convert_sync_bn",
    "get_model",
    "heads",
    "model_output_has_nan",
    "register_model",
    "trunks",
]

"""``identity`` head: returns its input."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn as nn

from vissl.models.heads import register_model_head


@register_model_head("identity")
class IdentityHead(nn.Module):
    """Pass-through head (useful to keep the trunk feature as a model output).

    Args:
        model_config: config.MODEL (unused).
    """

    def __init__(self, model_config: Mapping[str, Any] | None = None) -> None:
        super().__init__()

    def forward(self, batch: Any) -> Any:
        return batch

"""``vision_transformer_head``: the ViT paper's classification head (VISSL's name and keys).

Dosovitskiy et al. (https://arxiv.org/abs/2010.11929) pre-train with an MLP of one hidden
layer (``pre_logits``, tanh) and fine-tune with a single linear layer; this head is the
first with ``hidden_dim`` and the second without it. The parameter names
(``layers.pre_logits``, ``layers.head``) are VISSL's, so its checkpoints load.
Initialisation as in VISSL: ``pre_logits`` LeCun normal (a normal of std
``1 / sqrt(in_plane)`` truncated to [-2, 2]) with zero bias, ``head`` a normal of std 0.02
truncated to [-2, 2] with zero bias (DeiT).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn as nn

from vissl.config.params import IntAtLeast, Note
from vissl.errors import ConfigError
from vissl.models.heads import parse_head, register_model_head

_KEY = "config.MODEL.HEAD.PARAMS"


PosInt = Annotated[int, IntAtLeast(1)]


@dataclass(kw_only=True, frozen=True)
class VisionTransformerHeadParams:
    """vision_transformer_head's arguments (VISSL's)."""

    in_plane: PosInt
    num_classes: PosInt
    hidden_dim: Annotated[PosInt | None, Note("null: a linear head")] = None


@register_model_head("vision_transformer_head")
class VisionTransformerHead(nn.Module):
    """``Linear(in_plane, num_classes)``, or with ``hidden_dim``
    ``Linear(in_plane, hidden_dim) -> tanh -> Linear(hidden_dim, num_classes)``.

    Args:
        model_config: config.MODEL (unused).
        in_plane: the feature size (the ViT's ``HIDDEN_DIM``).
        num_classes: the number of outputs.
        hidden_dim: the hidden layer's width (pre-training); null: a linear head.
    """

    def __init__(
        self,
        model_config: Mapping[str, Any] | None,
        in_plane: int,
        num_classes: int,
        hidden_dim: int | None = VisionTransformerHeadParams.hidden_dim,
    ) -> None:
        super().__init__()
        p = parse_head(
            VisionTransformerHeadParams,
            "vision_transformer_head",
            {"in_plane": in_plane, "num_classes": num_classes, "hidden_dim": hidden_dim},
        )
        in_plane, num_classes, hidden_dim = p.in_plane, p.num_classes, p.hidden_dim
        layers: list[tuple[str, nn.Module]]
        if hidden_dim is None:
            layers = [("head", nn.Linear(in_plane, num_classes))]
        else:
            layers = [
                ("pre_logits", nn.Linear(in_plane, hidden_dim)),
                ("act", nn.Tanh()),
                ("head", nn.Linear(hidden_dim, num_classes)),
            ]
        self.layers = nn.Sequential(OrderedDict(layers))
        self.in_plane = in_plane
        self.init_weights()

    def init_weights(self) -> None:
        """LeCun normal ``pre_logits``, std-0.02 ``head``, zero biases (see the module)."""
        pre_logits = getattr(self.layers, "pre_logits", None)
        if isinstance(pre_logits, nn.Linear):
            nn.init.trunc_normal_(pre_logits.weight, std=math.sqrt(1.0 / pre_logits.in_features))
            nn.init.zeros_(pre_logits.bias)
        head = self.layers.head
        assert isinstance(head, nn.Linear)
        nn.init.trunc_normal_(head.weight, std=0.02)
        nn.init.zeros_(head.bias)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        if batch.ndim != 2 or batch.shape[1] != self.in_plane:
            raise ConfigError(
                f"{_KEY}: vision_transformer_head has in_plane={self.in_plane} but got a "
                f"feature of shape {tuple(batch.shape)}; set in_plane to the trunk's feature "
                "size (the ViT's HIDDEN_DIM, with CLASSIFIER token or gap).",
                _KEY,
            )
        return self.layers(batch)  # type: ignore[no-any-return]

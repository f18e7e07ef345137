"""Frozen trunk tapping several layers, for linear evaluation (VISSL's FeatureExtractorModel).

Used by the base model when FEATURE_EVAL_SETTINGS.EVAL_MODE_ON, a FREEZE_* flag and a
non-empty LINEAR_EVAL_FEAT_POOL_OPS_MAP are set. Each map entry is
``[feature_name, [pool_op, [args...]]]``, e.g. ``["res4", ["AvgPool2d", [[6, 6], 2, 0]]]``.
The wrapped trunk is ``base_model`` (state-dict keys ``trunk.base_model.*``, as in VISSL).
Not registered as a trunk.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from vissl.errors import ConfigError
from vissl.models.model_helpers import Identity, cfg_get
from vissl.models.trunks import get_model_trunk

logger = logging.getLogger(__name__)

_KEY = "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP"

POOL_OPS: dict[str, type[nn.Module]] = {
    "AdaptiveAvgPool2d": nn.AdaptiveAvgPool2d,
    "AdaptiveMaxPool2d": nn.AdaptiveMaxPool2d,
    "AvgPool2d": nn.AvgPool2d,
    "MaxPool2d": nn.MaxPool2d,
    "Identity": Identity,
}


class FeatureExtractorModel(nn.Module):
    """Run a frozen trunk, pool each requested feature, optionally flatten it.

    Args:
        model_config: config.MODEL.
    """

    def __init__(self, model_config: Mapping[str, Any]) -> None:
        super().__init__()
        self.model_config = model_config
        trunk_name = cfg_get(model_config, "TRUNK.NAME", "resnet")
        self.base_model = get_model_trunk(trunk_name)(model_config, trunk_name)
        self.should_flatten = bool(
            cfg_get(model_config, "FEATURE_EVAL_SETTINGS.SHOULD_FLATTEN_FEATS", True)
        )
        ops = []
        for i, item in enumerate(
            cfg_get(model_config, "FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP", [])
        ):
            spec = item[1] if isinstance(item, list | tuple) and len(item) == 2 else None
            if not (
                isinstance(spec, list | tuple)
                and len(spec) == 2
                and isinstance(spec[1], list | tuple)
                and spec[0] in POOL_OPS
            ):
                raise ConfigError(
                    f"{_KEY}[{i}]={item!r}: expected [feature_name, [pool_op, [args...]]] "
                    f"with pool_op in {sorted(POOL_OPS)}, e.g. "
                    '["res5", ["AdaptiveAvgPool2d", [[1, 1]]]].',
                    _KEY,
                )
            try:
                ops.append(POOL_OPS[spec[0]](*spec[1]))
            except (TypeError, ValueError) as err:
                raise ConfigError(
                    f"{_KEY}[{i}]={item!r}: {spec[0]} cannot be built with the arguments "
                    f"{list(spec[1])}: {err}",
                    _KEY,
                ) from None
        self.feature_pool_ops = nn.ModuleList(ops)
        for param in self.base_model.parameters():
            param.requires_grad = False
        self.train(self.training)

    def forward(
        self, batch: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """Pooled (and flattened) features, one per LINEAR_EVAL_FEAT_POOL_OPS_MAP entry."""
        feats = self.base_model(batch, out_feat_keys)
        if len(feats) != len(self.feature_pool_ops):
            raise ConfigError(
                f"The trunk returned {len(feats)} features but {_KEY} has "
                f"{len(self.feature_pool_ops)} entries; they must match.",
                _KEY,
            )
        out = []
        for feat, op in zip(feats, self.feature_pool_ops):
            feat = op(feat)
            if self.should_flatten:
                feat = torch.flatten(feat, start_dim=1)
            out.append(feat)
        return out

    def train(self, mode: bool = True) -> FeatureExtractorModel:
        """Set the mode of the pool ops; the wrapped trunk always stays in eval mode."""
        super().train(mode)
        self.base_model.train(False)
        return self

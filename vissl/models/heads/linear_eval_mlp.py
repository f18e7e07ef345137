"""``eval_mlp`` head: BatchNorm2d on the (pooled) feature, then an ``mlp`` classifier."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from vissl.errors import ConfigError
from vissl.models.heads import register_model_head
from vissl.models.heads.mlp import MLP
from vissl.models.heads.mlp_res import MLPResidual
from vissl.models.model_helpers import cfg_get


@register_model_head("eval_mlp")
class LinearEvalMLP(nn.Module):
    """Linear-evaluation head attached to a trunk layer: BatchNorm2d -> flatten -> MLP.

    Accepts N x C x H x W features (flattened to ``C*H*W`` after the norm, which must
    equal ``dims[0]``) or N x C features (treated as N x C x 1 x 1).

    Args:
        model_config: config.MODEL.
        in_channels: channels C of the feature (for the BatchNorm2d).
        dims: MLP sizes, e.g. ``[2048, 1000]``.
        use_bn: BatchNorm1d inside the MLP.
        use_relu: ReLU inside the MLP.
        use_residual: the MLP is ``mlp_res`` (skip connections where sizes allow; VISSL
            main's option).
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        in_channels: int,
        dims: list[int],
        use_bn: bool = False,
        use_relu: bool = False,
        use_residual: bool = False,
    ) -> None:
        super().__init__()
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels <= 0:
            raise ConfigError(
                "config.MODEL.HEAD.PARAMS: head 'eval_mlp' needs `in_channels`, a positive "
                f"integer; got {in_channels!r}.",
                "config.MODEL.HEAD.PARAMS",
            )
        self.channel_bn = nn.BatchNorm2d(
            in_channels,
            eps=float(cfg_get(model_config, "HEAD.BATCHNORM_EPS", 1e-5)),
            momentum=float(cfg_get(model_config, "HEAD.BATCHNORM_MOMENTUM", 0.1)),
        )
        mlp = MLPResidual if use_residual else MLP
        self.clf = mlp(model_config, dims, use_bn=use_bn, use_relu=use_relu)
        self.in_features = int(dims[0])

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        flattened = batch.ndim == 2
        if flattened:
            batch = batch[:, :, None, None]
        if batch.ndim != 4:
            raise ValueError(
                f"eval_mlp expects a 2D or 4D feature; got shape {tuple(batch.shape)}."
            )
        if batch.shape[1] != self.channel_bn.num_features:
            raise ConfigError(
                f"config.MODEL.HEAD.PARAMS: eval_mlp has in_channels="
                f"{self.channel_bn.num_features} but its feature has {batch.shape[1]} channels "
                f"(shape {tuple(batch.shape)}); set in_channels to {batch.shape[1]}."
                + (
                    " The feature arrived flattened: eval_mlp normalises each channel of a "
                    "pooled C x H x W map, so keep the maps with config.MODEL."
                    "FEATURE_EVAL_SETTINGS.SHOULD_FLATTEN_FEATS: False (as VISSL's linear "
                    "evaluation configs do)."
                    if flattened
                    else ""
                ),
                "config.MODEL.HEAD.PARAMS",
            )
        flat = batch.shape[1] * batch.shape[2] * batch.shape[3]
        if flat != self.in_features:
            raise ConfigError(
                f"config.MODEL.HEAD.PARAMS: eval_mlp has dims[0]={self.in_features} but its "
                f"feature of shape {tuple(batch.shape)} flattens to {flat} values; set "
                f"dims[0] to {flat} or change the pooling op of this layer in "
                "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP.",
                "config.MODEL.HEAD.PARAMS",
            )
        out = self.channel_bn(batch)
        return self.clf(torch.flatten(out, start_dim=1))

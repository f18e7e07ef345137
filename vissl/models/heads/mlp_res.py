"""``mlp_res`` head (VISSL main): an ``mlp`` whose layers add their input back when the
sizes allow it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from vissl.models.heads import register_model_head
from vissl.models.heads.mlp import check_dims, scale_head_weights
from vissl.models.model_helpers import cfg_get, flat_head_input


class MLPResidualBlock(nn.Module):
    """Linear (-> BatchNorm1d) (-> ReLU) (-> Dropout); the input is added to the output when
    ``in_dim == out_dim``."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        use_bias: bool,
        norm: nn.Module | None,
        use_relu: bool,
        use_dropout: bool,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(in_dim, out_dim, bias=use_bias)]
        if norm is not None:
            layers.append(norm)
        if use_relu:
            layers.append(nn.ReLU(inplace=True))
        if use_dropout:
            layers.append(nn.Dropout())
        self.mlp_res_block = nn.Sequential(*layers)
        self.residual = in_dim == out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.mlp_res_block(x)
        return x + out if self.residual else out


@register_model_head("mlp_res")
class MLPResidual(nn.Module):
    """As ``mlp`` (same arguments), each Linear block with a skip connection when its input
    and output sizes are equal. ``eval_mlp`` uses it with ``use_residual: True``.

    Args:
        model_config: config.MODEL (HEAD.BATCHNORM_EPS, BATCHNORM_MOMENTUM,
            PARAMS_MULTIPLIER are read).
        dims: layer sizes, e.g. ``[2048, 2048, 1000]``.
        use_bn: BatchNorm1d after each Linear.
        use_relu: ReLU after each Linear (after BN).
        use_dropout: Dropout after each Linear (after ReLU).
        use_bias: Linear layers with bias.
        skip_last_layer_relu_bn: no BN/ReLU/Dropout in the last block.
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        dims: list[int],
        use_bn: bool = False,
        use_relu: bool = False,
        use_dropout: bool = False,
        use_bias: bool = True,
        skip_last_layer_relu_bn: bool = True,
    ) -> None:
        super().__init__()
        dims = check_dims(dims, "mlp_res")
        eps = float(cfg_get(model_config, "HEAD.BATCHNORM_EPS", 1e-5))
        momentum = float(cfg_get(model_config, "HEAD.BATCHNORM_MOMENTUM", 0.1))
        blocks: list[nn.Module] = []
        n = len(dims) - 1
        for i in range(n):
            keep = not (i == n - 1 and skip_last_layer_relu_bn)
            norm = (
                nn.BatchNorm1d(dims[i + 1], eps=eps, momentum=momentum) if use_bn and keep else None
            )
            blocks.append(
                MLPResidualBlock(
                    dims[i], dims[i + 1], use_bias, norm, use_relu and keep, use_dropout and keep
                )
            )
        self.clf = nn.Sequential(*blocks)
        scale_head_weights(self, model_config)

    def forward(self, batch: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        return self.clf(flat_head_input(batch, "mlp_res head"))

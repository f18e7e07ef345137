"""``mlp`` head: a stack of Linear (-> BatchNorm1d) (-> ReLU) (-> Dropout) layers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

from vissl.errors import ConfigError
from vissl.models.heads import register_model_head
from vissl.models.model_helpers import cfg_get, flat_head_input

_KEY = "config.MODEL.HEAD.PARAMS"


def check_dims(dims: Any, head: str, min_len: int = 2) -> list[int]:
    """Validate a head's ``dims`` argument: a list of at least ``min_len`` positive ints."""
    if (
        not isinstance(dims, Sequence)
        or isinstance(dims, str)
        or len(dims) < min_len
        or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)
    ):
        raise ConfigError(
            f"{_KEY}: head {head!r} needs `dims`, a list of at least {min_len} positive "
            f"integers such as [2048, 128] (input dim first); got {dims!r}.",
            _KEY,
        )
    return list(dims)


def scale_head_weights(module: nn.Module, model_config: Mapping[str, Any]) -> None:
    """Multiply every Linear weight and bias by MODEL.HEAD.PARAMS_MULTIPLIER."""
    multiplier = float(cfg_get(model_config, "HEAD.PARAMS_MULTIPLIER", 1.0))
    if multiplier == 1.0:
        return
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear):
                m.weight.mul_(multiplier)
                if m.bias is not None:
                    m.bias.mul_(multiplier)


@register_model_head("mlp")
class MLP(nn.Module):
    """Linear layers ``dims[0] -> dims[1] -> ...``, each optionally followed by
    BatchNorm1d, ReLU and Dropout (skipped after the last layer by default).

    Accepts an N x D tensor, an N x D x 1 x 1 tensor, or a one-element list of them;
    any other shape is flattened from dim 1.

    Args:
        model_config: config.MODEL (HEAD.BATCHNORM_EPS, BATCHNORM_MOMENTUM,
            PARAMS_MULTIPLIER are read).
        dims: layer sizes, e.g. ``[2048, 2048, 128]``.
        use_bn: add BatchNorm1d after each Linear.
        use_relu: add ReLU after each Linear (after BN).
        use_dropout: add Dropout after each Linear (after ReLU).
        use_bias: Linear layers with bias.
        skip_last_layer_relu_bn: no BN/ReLU/Dropout after the last Linear.
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
        dims = check_dims(dims, "mlp")
        eps = float(cfg_get(model_config, "HEAD.BATCHNORM_EPS", 1e-5))
        momentum = float(cfg_get(model_config, "HEAD.BATCHNORM_MOMENTUM", 0.1))
        layers: list[nn.Module] = []
        n = len(dims) - 1
        for i in range(n):
            layers.append(nn.Linear(dims[i], dims[i + 1], bias=use_bias))
            if i == n - 1 and skip_last_layer_relu_bn:
                break
            if use_bn:
                layers.append(nn.BatchNorm1d(dims[i + 1], eps=eps, momentum=momentum))
            if use_relu:
                layers.append(nn.ReLU(inplace=True))
            if use_dropout:
                layers.append(nn.Dropout())
        self.clf = nn.Sequential(*layers)
        scale_head_weights(self, model_config)

    def forward(self, batch: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        return self.clf(flat_head_input(batch, "mlp head"))

"""``colorization_head``: per-pixel logits over the ab bins of Colorization.

A stack of 1x1 convolutions on a trunk feature map ``(N, C, h, w)``: ``dims: [C, ...,
Q]``, every hidden layer followed by BatchNorm (``use_bn``) and ReLU, the last one giving
``Q`` logits per pixel of the map, at the trunk's output resolution (``colorization_loss``
soft-encodes the ab target at that resolution). With ``alexnet_colorization`` the map is
``conv5`` (MODEL.TRUNK.ALEXNET.DEFAULT_OUTPUT: conv5), 256 channels: e.g. ``dims: [256,
1024, 262]``. vissl's own head (VISSL has none for colorization).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn

from vissl.errors import ConfigError
from vissl.models.heads import register_model_head
from vissl.models.heads.mlp import check_dims
from vissl.models.model_helpers import cfg_get

_KEY = "config.MODEL.HEAD.PARAMS"


@register_model_head("colorization_head")
class ColorizationHead(nn.Module):
    """1x1 convolutions ``dims[0] -> ... -> dims[-1]`` on a feature map.

    Args:
        model_config: config.MODEL (HEAD.BATCHNORM_EPS / BATCHNORM_MOMENTUM).
        dims: channels, input first, number of bins last (at least 2 entries).
        use_bn: BatchNorm2d after each hidden convolution.
    """

    def __init__(self, model_config: Mapping[str, Any], dims: list[int], use_bn: bool = True):
        super().__init__()
        dims = check_dims(dims, "colorization_head")
        eps = float(cfg_get(model_config, "HEAD.BATCHNORM_EPS", 1e-5))
        momentum = float(cfg_get(model_config, "HEAD.BATCHNORM_MOMENTUM", 0.1))
        layers: list[nn.Module] = []
        for i in range(len(dims) - 1):
            last = i == len(dims) - 2
            layers.append(nn.Conv2d(dims[i], dims[i + 1], kernel_size=1, bias=last or not use_bn))
            if not last:
                if use_bn:
                    layers.append(nn.BatchNorm2d(dims[i + 1], eps=eps, momentum=momentum))
                layers.append(nn.ReLU(inplace=True))
        self.dims = dims
        self.clf = nn.Sequential(*layers)

    def forward(self, batch: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        """Logits ``(N, dims[-1], h, w)`` of a feature map ``(N, dims[0], h, w)``.

        Raises:
            ConfigError: the input is not a map of ``dims[0]`` channels (e.g. the trunk's
                flattened output).
        """
        x = batch if isinstance(batch, torch.Tensor) else batch[0]
        if x.dim() != 4 or x.shape[1] != self.dims[0]:
            raise ConfigError(
                f"{_KEY}: colorization_head takes a feature map (N, {self.dims[0]}, h, w); "
                f"got shape {tuple(x.shape)}. Give it a trunk map, e.g. set "
                "config.MODEL.TRUNK.ALEXNET.DEFAULT_OUTPUT: conv5 with alexnet_colorization, "
                "and the map's channels as the first dims entry.",
                _KEY,
            )
        return self.clf(x)

"""Trunk ``alexnet_deepcluster``: the AlexNet of DeepCluster (Caron et al. 2018), as VISSL.

The RGB input (224 px) first goes through a fixed Sobel filter, ``sobel``: a 1x1 conv
averaging the three channels to gray, then a 3x3 conv giving the horizontal and vertical
gradients (2 channels). Its kernels are constants, kept as non-persistent buffers: VISSL
made them frozen parameters (``sobel.0.weight``, ...), which its converted DeepCluster
file lacks and its own checkpoints hold; without them in the state dict both load here
(the file's ``trunk.sobel.*`` keys, if any, are reported unused). Then five convs with
BatchNorm (no groups, no LRN; conv1 padded by 2). Feature and state-dict names are VISSL's
(see :mod:`vissl.models.trunks.alexnet_common`); ``flatten`` (N x 9216 at 224 px) is the
default output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from vissl.models.trunks import register_model_trunk
from vissl.models.trunks.alexnet_common import (
    AlexNetTrunk,
    conv_relu,
    flatten_block,
    max_pool,
)


class SobelFilter(nn.Module):
    """Fixed gray-scale + Sobel filter: N x 3 x H x W -> N x 2 x H x W (d/dx, d/dy).

    The mean of the three channels (VISSL's 1x1 conv with weights 1/3), then the two 3x3
    Sobel kernels with zero padding 1. The kernels are constants: non-persistent buffers,
    never trained and not in the state dict.
    """

    gray_weight: torch.Tensor
    sobel_weight: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("gray_weight", torch.full((1, 3, 1, 1), 1.0 / 3.0), persistent=False)
        kernels = torch.tensor(
            [
                [[1.0, 0.0, -1.0], [2.0, 0.0, -2.0], [1.0, 0.0, -1.0]],
                [[1.0, 2.0, 1.0], [0.0, 0.0, 0.0], [-1.0, -2.0, -1.0]],
            ]
        )
        self.register_buffer("sobel_weight", kernels.unsqueeze(1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gray = F.conv2d(x, self.gray_weight.to(x.dtype))
        return F.conv2d(gray, self.sobel_weight.to(x.dtype), padding=1)


@register_model_trunk("alexnet_deepcluster")
class AlexNetDeepCluster(AlexNetTrunk):
    """DeepCluster AlexNet: Sobel, conv1 11x11/4 pad 2 (96), pool, conv2 5x5 (256), pool,
    conv3 (384), conv4 (384), conv5 (256), pool5; BatchNorm in all.

    Args:
        model_config: config.MODEL (INPUT_TYPE rgb or bgr; TRUNK.ALEXNET).
        model_name: the registry name.
    """

    def __init__(
        self, model_config: Mapping[str, Any], model_name: str = "alexnet_deepcluster"
    ) -> None:
        blocks = [
            conv_relu(2, 96, 11, stride=4, padding=2, batch_norm=True),
            max_pool(),
            conv_relu(96, 256, 5, padding=2, batch_norm=True),
            max_pool(),
            conv_relu(256, 384, 3, padding=1, batch_norm=True),
            conv_relu(384, 384, 3, padding=1, batch_norm=True),
            conv_relu(384, 256, 3, padding=1, batch_norm=True),
            max_pool(),
            flatten_block(),
        ]
        channels = [96, 96, 256, 256, 384, 384, 256, 256]
        super().__init__(model_config, model_name, blocks, channels, input_size=224)
        self.sobel = SobelFilter()

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        """Sobel gradients of the gray image (after the RGB/BGR handling)."""
        return self.sobel(super().preprocess(x))

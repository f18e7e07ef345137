"""Trunk ``alexnet_bvlc``: Caffe's BVLC AlexNet (Krizhevsky et al. 2012), as VISSL.

The supervised reference of Goyal et al. 2019's benchmark: RGB input (227 px), no
BatchNorm, LRN before each of the first two max-pools, grouped conv2/4/5 (2 groups, the
two-GPU split of the original). Feature names and state-dict names are VISSL's (see
:mod:`vissl.models.trunks.alexnet_common`); ``flatten`` (N x 9216 at 227 px) is the
default output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn as nn

from vissl.models.trunks import register_model_trunk
from vissl.models.trunks.alexnet_common import (
    AlexNetTrunk,
    conv_relu,
    flatten_block,
    local_response_norm,
    max_pool,
)


@register_model_trunk("alexnet_bvlc")
class AlexNetBvlc(AlexNetTrunk):
    """BVLC AlexNet: conv1 11x11/4 (96), LRN+pool, conv2 5x5 g2 (256), LRN+pool,
    conv3 (384), conv4 g2 (384), conv5 g2 (256), pool5.

    Args:
        model_config: config.MODEL (INPUT_TYPE rgb or bgr; TRUNK.ALEXNET).
        model_name: the registry name.
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "alexnet_bvlc") -> None:
        blocks = [
            conv_relu(3, 96, 11, stride=4),
            nn.Sequential(local_response_norm(), max_pool()),
            conv_relu(96, 256, 5, padding=2, groups=2),
            nn.Sequential(local_response_norm(), max_pool()),
            conv_relu(256, 384, 3, padding=1),
            conv_relu(384, 384, 3, padding=1, groups=2),
            conv_relu(384, 256, 3, padding=1, groups=2),
            max_pool(),
            flatten_block(),
        ]
        channels = [96, 96, 256, 256, 384, 384, 256, 256]
        super().__init__(model_config, model_name, blocks, channels, input_size=227)

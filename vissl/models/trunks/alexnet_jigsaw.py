"""Trunk ``alexnet_jigsaw``: the AlexNet of Goyal et al. 2019's Jigsaw models, as VISSL.

RGB input (227 px); conv1 has stride 2 (not 4), so the maps are about twice as large as
BVLC's (conv5: 26 x 26 at 227 px); max-pool then LRN after conv1 and conv2, BatchNorm in
conv3-5, grouped conv2/4/5. Feature and state-dict names are VISSL's (see
:mod:`vissl.models.trunks.alexnet_common`); ``flatten`` (N x 36864 at 227 px) is the
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


@register_model_trunk("alexnet_jigsaw")
class AlexNetJigsaw(AlexNetTrunk):
    """Jigsaw AlexNet: conv1 11x11/2 (96), pool+LRN, conv2 5x5 g2 (256), pool+LRN,
    conv3-5 with BatchNorm (384, 384 g2, 256 g2), pool5.

    Args:
        model_config: config.MODEL (INPUT_TYPE rgb or bgr; TRUNK.ALEXNET).
        model_name: the registry name.
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "alexnet_jigsaw") -> None:
        blocks = [
            conv_relu(3, 96, 11, stride=2),
            nn.Sequential(max_pool(), local_response_norm()),
            conv_relu(96, 256, 5, padding=2, groups=2),
            nn.Sequential(max_pool(), local_response_norm()),
            conv_relu(256, 384, 3, padding=1, batch_norm=True),
            conv_relu(384, 384, 3, padding=1, groups=2, batch_norm=True),
            conv_relu(384, 256, 3, padding=1, groups=2, batch_norm=True),
            max_pool(),
            flatten_block(),
        ]
        channels = [96, 96, 256, 256, 384, 384, 256, 256]
        super().__init__(model_config, model_name, blocks, channels, input_size=227)

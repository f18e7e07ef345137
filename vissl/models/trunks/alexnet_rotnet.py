"""Trunk ``alexnet_rotnet``: the AlexNet of RotNet (Gidaris et al. 2018), as VISSL.

Narrower than BVLC (64, 192, 384, 256, 256 channels), BatchNorm in every conv, no groups,
no LRN, conv1 padded by 2; 224 px RGB input. Feature and state-dict names are VISSL's
(see :mod:`vissl.models.trunks.alexnet_common`), which are also those of the RotNet
authors' released weights; ``flatten`` (N x 9216 at 224 px) is the default output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vissl.models.trunks import register_model_trunk
from vissl.models.trunks.alexnet_common import (
    AlexNetTrunk,
    conv_relu,
    flatten_block,
    max_pool,
)


@register_model_trunk("alexnet_rotnet")
class AlexNetRotNet(AlexNetTrunk):
    """RotNet AlexNet: conv1 11x11/4 pad 2 (64), pool, conv2 5x5 (192), pool, conv3
    (384), conv4 (256), conv5 (256), pool5; BatchNorm in all.

    Args:
        model_config: config.MODEL (INPUT_TYPE rgb or bgr; TRUNK.ALEXNET).
        model_name: the registry name.
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "alexnet_rotnet") -> None:
        blocks = [
            conv_relu(3, 64, 11, stride=4, padding=2, batch_norm=True),
            max_pool(),
            conv_relu(64, 192, 5, padding=2, batch_norm=True),
            max_pool(),
            conv_relu(192, 384, 3, padding=1, batch_norm=True),
            conv_relu(384, 256, 3, padding=1, batch_norm=True),
            conv_relu(256, 256, 3, padding=1, batch_norm=True),
            max_pool(),
            flatten_block(),
        ]
        channels = [64, 64, 192, 192, 384, 256, 256, 256]
        super().__init__(model_config, model_name, blocks, channels, input_size=224)

"""Trunk ``alexnet_colorization``: the AlexNet of Goyal et al. 2019's Colorization models.

It takes MODEL.INPUT_TYPE ``lab`` only: the model input is the 3-channel Lab tensor of
``ImgPil2LabTensor`` (L - 50, a, b) and the trunk keeps its first channel, L (VISSL
splits the channels the same way). Every conv has BatchNorm; conv2/4/5 are grouped (2
groups); no LRN; 227 px input. Feature and state-dict names are VISSL's (see
:mod:`vissl.models.trunks.alexnet_common`); ``flatten`` (N x 9216 at 227 px) is the
default output. Colorization pretraining (docs/methods/colorization.md) puts its per-pixel
head on ``conv5`` with MODEL.TRUNK.ALEXNET.DEFAULT_OUTPUT: conv5.
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


@register_model_trunk("alexnet_colorization")
class AlexNetColorization(AlexNetTrunk):
    """Colorization AlexNet on the L channel: conv1 11x11/4 (96), pool, conv2 5x5 g2
    (256), pool, conv3 (384), conv4 g2 (384), conv5 g2 (256), pool5; BatchNorm in all.

    Args:
        model_config: config.MODEL (INPUT_TYPE must be ``lab``; TRUNK.ALEXNET).
        model_name: the registry name.

    Raises:
        ConfigError: MODEL.INPUT_TYPE is not ``lab``.
    """

    def __init__(
        self, model_config: Mapping[str, Any], model_name: str = "alexnet_colorization"
    ) -> None:
        blocks = [
            conv_relu(1, 96, 11, stride=4, batch_norm=True),
            max_pool(),
            conv_relu(96, 256, 5, padding=2, groups=2, batch_norm=True),
            max_pool(),
            conv_relu(256, 384, 3, padding=1, batch_norm=True),
            conv_relu(384, 384, 3, padding=1, groups=2, batch_norm=True),
            conv_relu(384, 256, 3, padding=1, groups=2, batch_norm=True),
            max_pool(),
            flatten_block(),
        ]
        channels = [96, 96, 256, 256, 384, 384, 256, 256]
        super().__init__(
            model_config, model_name, blocks, channels, input_types=("lab",), input_size=227
        )

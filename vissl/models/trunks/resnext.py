"""ResNe(X)t trunk ``resnet``, with VISSL's options and feature names.

Configured by MODEL.TRUNK.RESNETS: DEPTH (18, 34: BasicBlock; 50, 101, 152, 200:
Bottleneck), WIDTH_MULTIPLIER, GROUPS, WIDTH_PER_GROUP, NORM (BatchNorm | GroupNorm |
LayerNorm), GROUPNORM_GROUPS, ZERO_INIT_RESIDUAL, LAYER4_STRIDE, STANDARDIZE_CONVOLUTIONS,
SMALL_IMAGE_STEM (True: a 3x3 stride-1 first conv and no max-pool, as CIFAR/solo-learn
ResNets use for 32 px images; ``maxpool`` is then an identity so block names, feature
names and checkpoint keys are unchanged, and ``res1`` equals ``conv1``).

Layers live in ``_feature_blocks`` with VISSL's block names (``conv1``, ``bn1``,
``conv1_relu``, ``maxpool``, ``layer1``..``layer4``, ``avgpool``, ``flatten``) so that
VISSL ResNet checkpoints load unchanged. Features can be requested with VISSL's names:

=========  =====================================================  =====================
name       what                                                    shape (RN50, 224px)
=========  =====================================================  =====================
conv1      stem conv + norm + ReLU                                 N x 64 x 112 x 112
res1       after the stem max-pool                                 N x 64 x 56 x 56
res2..5    output of layer1..layer4                                N x 256..2048 x h x w
res5avg    global average pool of res5 (kept 4D, as in VISSL)      N x 2048 x 1 x 1
flatten    ``res5avg`` flattened: **the default output**           N x 2048
=========  =====================================================  =====================
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
import torch.nn as nn
from torchvision.models.resnet import BasicBlock, Bottleneck, conv1x1

from vissl.errors import ConfigError
from vissl.models.model_helpers import (
    Flatten,
    LayerNorm2d,
    cfg_get,
    get_trunk_forward_outputs,
    input_channels,
    standardize_convolutions,
    transform_model_input_data_type,
)
from vissl.models.trunks import register_model_trunk

logger = logging.getLogger(__name__)

_KEY = "config.MODEL.TRUNK.RESNETS"

#: DEPTH -> (block class, blocks per stage)
BLOCK_CONFIG: dict[int, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, int, int, int]]] = {
    18: (BasicBlock, (2, 2, 2, 2)),
    34: (BasicBlock, (3, 4, 6, 3)),
    50: (Bottleneck, (3, 4, 6, 3)),
    101: (Bottleneck, (3, 4, 23, 3)),
    152: (Bottleneck, (3, 8, 36, 3)),
    200: (Bottleneck, (3, 24, 36, 3)),
}

SUPPORTED_NORMS = ("BatchNorm", "GroupNorm", "LayerNorm")
SUPPORTED_L4_STRIDES = (1, 2)

#: VISSL feature name -> block name in ``_feature_blocks``.
FEATURE_MAPPING: dict[str, str] = {
    "conv1": "conv1_relu",
    "res1": "maxpool",
    "res2": "layer1",
    "res3": "layer2",
    "res4": "layer3",
    "res5": "layer4",
    "res5avg": "avgpool",
    "flatten": "flatten",
}


def _group_norm(num_groups: int, num_channels: int) -> nn.GroupNorm:
    if num_channels % num_groups != 0:
        raise ConfigError(
            f"{_KEY}.GROUPNORM_GROUPS={num_groups} does not divide a layer width "
            f"({num_channels} channels); pick a divisor of the trunk widths (e.g. 32).",
            f"{_KEY}.GROUPNORM_GROUPS",
        )
    return nn.GroupNorm(num_groups, num_channels)


def get_norm_layer(trunk_config: Mapping[str, Any]) -> Callable[[int], nn.Module]:
    """The norm-layer factory for RESNETS.NORM (``channels -> module``).

    Raises:
        ConfigError: NORM is not one of BatchNorm, GroupNorm, LayerNorm.
    """
    norm = trunk_config.get("NORM", "BatchNorm")
    if norm == "BatchNorm":
        return nn.BatchNorm2d
    if norm == "LayerNorm":
        return LayerNorm2d
    if norm == "GroupNorm":
        groups = int(trunk_config.get("GROUPNORM_GROUPS", 32))
        if groups <= 0:
            raise ConfigError(
                f"{_KEY}.GROUPNORM_GROUPS must be a positive integer; got {groups}.",
                f"{_KEY}.GROUPNORM_GROUPS",
            )
        return partial(_group_norm, groups)
    raise ConfigError(
        f"{_KEY}.NORM={norm!r} is not supported; allowed values: {list(SUPPORTED_NORMS)}.",
        f"{_KEY}.NORM",
    )


def _positive_int(trunk_config: Mapping[str, Any], key: str, default: int) -> int:
    value = trunk_config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"{_KEY}.{key} must be a positive integer; got {value!r}.", f"{_KEY}.{key}"
        )
    return value


@register_model_trunk("resnet")
class ResNeXt(nn.Module):
    """ResNet / ResNeXt trunk built from torchvision's BasicBlock and Bottleneck.

    Args:
        model_config: config.MODEL; reads TRUNK.RESNETS, INPUT_TYPE and
            ACTIVATION_CHECKPOINTING.
        model_name: the registry name (unused; kept for VISSL's constructor signature).
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "resnet") -> None:
        super().__init__()
        self.model_config = model_config
        trunk_config: Mapping[str, Any] = cfg_get(model_config, "TRUNK.RESNETS", {}) or {}
        self.trunk_config = trunk_config

        depth = trunk_config.get("DEPTH", 50)
        if depth not in BLOCK_CONFIG or isinstance(depth, bool):
            raise ConfigError(
                f"{_KEY}.DEPTH={depth!r} is not supported; allowed values: {sorted(BLOCK_CONFIG)}.",
                f"{_KEY}.DEPTH",
            )
        self.depth = int(depth)
        block, layers = BLOCK_CONFIG[self.depth]

        mult = trunk_config.get("WIDTH_MULTIPLIER", 1)
        if isinstance(mult, bool) or not isinstance(mult, int | float) or mult <= 0:
            raise ConfigError(
                f"{_KEY}.WIDTH_MULTIPLIER must be a positive number; got {mult!r}.",
                f"{_KEY}.WIDTH_MULTIPLIER",
            )
        base_width = 64 * mult
        if base_width != int(base_width):
            raise ConfigError(
                f"{_KEY}.WIDTH_MULTIPLIER={mult} gives a non-integer stem width "
                f"64 x {mult} = {base_width}; use a multiple of 1/64.",
                f"{_KEY}.WIDTH_MULTIPLIER",
            )
        self.width_multiplier = mult
        self.groups = _positive_int(trunk_config, "GROUPS", 1)
        self.width_per_group = _positive_int(trunk_config, "WIDTH_PER_GROUP", 64)
        if block is BasicBlock and (self.groups != 1 or self.width_per_group != 64):
            raise ConfigError(
                f"{_KEY}.DEPTH={self.depth} uses BasicBlock, which supports only GROUPS=1 "
                f"and WIDTH_PER_GROUP=64 (got {self.groups} and {self.width_per_group}); "
                "use DEPTH 50 or more for ResNeXt.",
                f"{_KEY}.GROUPS",
            )
        stride4 = trunk_config.get("LAYER4_STRIDE", 2)
        if stride4 not in SUPPORTED_L4_STRIDES:
            raise ConfigError(
                f"{_KEY}.LAYER4_STRIDE={stride4!r} is not supported; allowed values: "
                f"{list(SUPPORTED_L4_STRIDES)}.",
                f"{_KEY}.LAYER4_STRIDE",
            )
        self.zero_init_residual = bool(trunk_config.get("ZERO_INIT_RESIDUAL", False))
        self._norm_layer = get_norm_layer(trunk_config)
        self.input_type = cfg_get(model_config, "INPUT_TYPE", "rgb")
        in_channels = input_channels(self.input_type)
        self.use_checkpointing = bool(
            cfg_get(model_config, "ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING", False)
        )
        self.num_checkpointing_splits = int(
            cfg_get(model_config, "ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS", 2)
        )

        self.small_image_stem = trunk_config.get("SMALL_IMAGE_STEM", False)
        if not isinstance(self.small_image_stem, bool):
            raise ConfigError(
                f"{_KEY}.SMALL_IMAGE_STEM must be true or false; got {self.small_image_stem!r}.",
                f"{_KEY}.SMALL_IMAGE_STEM",
            )
        width = int(base_width)
        self._inplanes = width
        logger.info(
            "Building ResNeXt%d-%dx%dd-w%s-%s",
            self.depth,
            self.groups,
            self.width_per_group,
            mult,
            trunk_config.get("NORM", "BatchNorm"),
        )
        stem_conv: nn.Module
        stem_pool: nn.Module
        if self.small_image_stem:
            # CIFAR-style stem: keeps the input resolution (32 px -> 4x4 after layer4)
            stem_conv = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
            stem_pool = nn.Identity()
        else:
            stem_conv = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)
            stem_pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        blocks: list[tuple[str, nn.Module]] = [
            ("conv1", stem_conv),
            ("bn1", self._norm_layer(width)),
            ("conv1_relu", nn.ReLU(inplace=True)),
            ("maxpool", stem_pool),
            ("layer1", self._make_layer(block, width, layers[0])),
            ("layer2", self._make_layer(block, width * 2, layers[1], stride=2)),
            ("layer3", self._make_layer(block, width * 4, layers[2], stride=2)),
            ("layer4", self._make_layer(block, width * 8, layers[3], stride=stride4)),
            ("avgpool", nn.AdaptiveAvgPool2d((1, 1))),
            ("flatten", Flatten(1)),
        ]
        self._feature_blocks = nn.ModuleDict(dict(blocks))
        self.feat_eval_mapping = dict(FEATURE_MAPPING)
        self.output_dim = self._inplanes
        self._init_weights()
        if trunk_config.get("STANDARDIZE_CONVOLUTIONS", False):
            standardize_convolutions(self._feature_blocks)

    def _make_layer(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        planes: int,
        blocks: int,
        stride: int = 1,
    ) -> nn.Sequential:
        downsample: nn.Module | None = None
        out = planes * block.expansion
        if stride != 1 or self._inplanes != out:
            downsample = nn.Sequential(conv1x1(self._inplanes, out, stride), self._norm_layer(out))
        kwargs: dict[str, Any] = {
            "groups": self.groups,
            "base_width": self.width_per_group,
            "norm_layer": self._norm_layer,
        }
        layers = [block(self._inplanes, planes, stride, downsample, **kwargs)]
        self._inplanes = out
        layers += [block(self._inplanes, planes, **kwargs) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def _init_weights(self) -> None:
        """He (fan-out) init for convs, 1/0 for norms; optionally zero the last norm of
        each residual branch so every block starts as the identity."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d | nn.GroupNorm) and m.weight is not None:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if self.zero_init_residual:
            for m in self.modules():
                last = None
                if isinstance(m, Bottleneck):
                    last = m.bn3
                elif isinstance(m, BasicBlock):
                    last = m.bn2
                if last is not None and getattr(last, "weight", None) is not None:
                    nn.init.zeros_(last.weight)

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """Return the features named in ``out_feat_keys`` (default: ``["flatten"]``)."""
        model_input = transform_model_input_data_type(x, self.input_type)
        return get_trunk_forward_outputs(
            model_input,
            out_feat_keys=out_feat_keys,
            feature_blocks=self._feature_blocks,
            feature_mapping=self.feat_eval_mapping,
            use_checkpointing=self.use_checkpointing,
            checkpointing_splits=self.num_checkpointing_splits,
        )

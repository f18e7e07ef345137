"""Trunk ``resnet_sk``: SimCLR-v2's ResNet with selective kernels (Chen et al. 2020),
VISSL's ``resnet_sk``.

Configured by MODEL.TRUNK.RESNETS_SK, VISSL's keys:

- ``DEPTH`` (152): 50 | 101 | 152 | 200 bottleneck blocks per stage (3, 4, 6, 3),
  (3, 4, 23, 3), (3, 8, 36, 3), (3, 24, 36, 3). VISSL builds 152 only (SimCLR-v2's
  released models are 50, 101 and 152 deep).
- ``WIDTH_MULTIPLIER`` (3): an integer multiplying every width (stem 64 w, stages
  64 w .. 512 w, outputs 4x that).
- ``SK_RATIO`` (0.0625): > 0 builds selective kernels: every 3x3 convolution of the
  blocks computes two branches, mixed per channel by a softmax over weights from the
  pooled sum of the branches (through a bottleneck of max(SK_RATIO * width, 32)
  channels), a 3-convolution stem and average-pool shortcuts; 0 builds SimCLR-v2's plain
  ResNet (7x7 stem, strided 1x1 shortcuts).

BatchNorm eps 1e-5, momentum 0.1; PyTorch's default init, as VISSL.

State-dict names are VISSL's (SimCLR-v2's PyTorch port), so VISSL's converted SimCLR-v2
checkpoints load: ``net.0.*`` is the stem, ``net.<1..4>.blocks.<j>.{projection.shortcut,
projection.bn, net.<k>}`` the stages (``net.<k>.main_conv`` / ``mixing_conv`` for the
selective kernels).

Features (``out_feat_keys``), vissl ResNet's names:

=========  ===================================  ===========================
name       what                                 shape
=========  ===================================  ===========================
flatten    the global average pool: the         N x 2048 w
           default (VISSL's only output)
res5avg    the same as N x C x 1 x 1            N x 2048 w x 1 x 1
conv1      the stem (conv, BN, ReLU, max-pool)  N x 64 w x H/4 x W/4
res2..res5 the output of stage 1..4             N x 256 w 2^(i-2) x H/2^i x W/2^i
=========  ===================================  ===========================
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from vissl.config.params import OneOf, Unit
from vissl.models.model_helpers import cfg_get, input_channels, transform_model_input_data_type
from vissl.models.trunks import register_model_trunk
from vissl.models.trunks._trunk_params import (
    PosInt,
    checkpointing_on,
    maybe_checkpoint,
    parse_trunk,
    resolve_features,
)

logger = logging.getLogger(__name__)

#: DEPTH -> bottleneck blocks per stage.
BLOCKS_PER_STAGE: dict[int, tuple[int, int, int, int]] = {
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
    200: (3, 24, 36, 3),
}
BN_EPS = 1e-5
EXPANSION = 4
_SK_MIN_DIM = 32


@dataclass(kw_only=True, frozen=True)
class ResNetSKParams:
    """``config.MODEL.TRUNK.RESNETS_SK`` (VISSL's defaults: SimCLR-v2's ResNet-152 3x SK)."""

    DEPTH: Annotated[int, OneOf(*BLOCKS_PER_STAGE)] = 152
    WIDTH_MULTIPLIER: PosInt = 3
    SK_RATIO: Annotated[float, Unit] = 0.0625


def _conv(c_in: int, c_out: int, kernel: int = 3, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=(kernel - 1) // 2, bias=False)


class BatchNormRelu(nn.Sequential):
    """BatchNorm (``0``) then ReLU (``1``, identity when ``relu`` is False)."""

    def __init__(self, channels: int, relu: bool = True) -> None:
        super().__init__(nn.BatchNorm2d(channels, eps=BN_EPS), nn.ReLU() if relu else nn.Identity())


class SelectiveKernel(nn.Module):
    """Two 3x3 branches (one convolution of twice the width), mixed per channel.

    ``main_conv`` computes both branches; their sum, average-pooled, goes through
    ``mixing_conv`` (1x1 down to max(SK_RATIO * width, 32), BN-ReLU, 1x1 up to two
    weights per channel), and a softmax over the two branches weighs them.
    """

    def __init__(self, c_in: int, c_out: int, stride: int, sk_ratio: float) -> None:
        super().__init__()
        self.main_conv = nn.Sequential(
            _conv(c_in, 2 * c_out, stride=stride), BatchNormRelu(2 * c_out)
        )
        mid = max(int(c_out * sk_ratio), _SK_MIN_DIM)
        self.mixing_conv = nn.Sequential(
            _conv(c_out, mid, kernel=1), BatchNormRelu(mid), _conv(mid, 2 * c_out, kernel=1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = torch.stack(self.main_conv(x).chunk(2, dim=1))  # 2 x N x C x H x W
        pooled = branches.sum(dim=0).mean(dim=(2, 3), keepdim=True)
        weights = torch.stack(self.mixing_conv(pooled).chunk(2, dim=1)).softmax(dim=0)
        return (branches * weights).sum(dim=0)


class Projection(nn.Module):
    """The shortcut of a stage's first block: a strided 1x1 conv (no SK), or a 2x2
    average pool (stride ``stride``) and a 1x1 conv (SK), then BatchNorm."""

    def __init__(self, c_in: int, c_out: int, stride: int, sk_ratio: float) -> None:
        super().__init__()
        self.shortcut: nn.Module
        if sk_ratio > 0:
            self.shortcut = nn.Sequential(
                nn.ZeroPad2d((0, 1, 0, 1)),
                nn.AvgPool2d(kernel_size=2, stride=stride),
                _conv(c_in, c_out, kernel=1),
            )
        else:
            self.shortcut = _conv(c_in, c_out, kernel=1, stride=stride)
        self.bn = BatchNormRelu(c_out, relu=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.shortcut(x))


class BottleneckBlock(nn.Module):
    """1x1, 3x3 (or selective kernel) with the stride, 1x1 to 4x the width; residual."""

    def __init__(
        self, c_in: int, width: int, stride: int, sk_ratio: float, use_projection: bool
    ) -> None:
        super().__init__()
        self.projection: nn.Module = (
            Projection(c_in, width * EXPANSION, stride, sk_ratio)
            if use_projection
            else nn.Identity()
        )
        ops: list[nn.Module] = [_conv(c_in, width, kernel=1), BatchNormRelu(width)]
        if sk_ratio > 0:
            ops.append(SelectiveKernel(width, width, stride, sk_ratio))
        else:
            ops += [_conv(width, width, stride=stride), BatchNormRelu(width)]
        ops += [_conv(width, width * EXPANSION, kernel=1), BatchNormRelu(width * EXPANSION, False)]
        self.net = nn.Sequential(*ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.projection(x) + self.net(x))


class Blocks(nn.Module):
    """One stage: a first block with the projection shortcut, then ``n - 1`` blocks."""

    def __init__(self, n: int, c_in: int, width: int, stride: int, sk_ratio: float) -> None:
        super().__init__()
        self.channels_out = width * EXPANSION
        self.blocks = nn.ModuleList(
            [BottleneckBlock(c_in, width, stride, sk_ratio, use_projection=True)]
            + [
                BottleneckBlock(self.channels_out, width, 1, sk_ratio, use_projection=False)
                for _ in range(n - 1)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class Stem(nn.Sequential):
    """SK: three 3x3 convs (the first with stride 2) to 64 w; else a 7x7 / 2 conv;
    then BN-ReLU and a 3x3 / 2 max-pool."""

    def __init__(self, in_chans: int, sk_ratio: float, width_multiplier: int) -> None:
        half = 64 * width_multiplier // 2
        ops: list[nn.Module]
        if sk_ratio > 0:
            ops = [
                _conv(in_chans, half, stride=2),
                BatchNormRelu(half),
                _conv(half, half),
                BatchNormRelu(half),
                _conv(half, 2 * half),
            ]
        else:
            ops = [_conv(in_chans, 2 * half, kernel=7, stride=2)]
        ops += [BatchNormRelu(2 * half), nn.MaxPool2d(kernel_size=3, stride=2, padding=1)]
        super().__init__(*ops)


@register_model_trunk("resnet_sk")
class ResNetSelectiveKernel(nn.Module):
    """SimCLR-v2's ResNet (with or without selective kernels) and ResNet feature taps.

    Args:
        model_config: config.MODEL; reads TRUNK.RESNETS_SK, INPUT_TYPE and
            ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING (each stage).
        model_name: the registry name (unused).

    Raises:
        ConfigError: a bad RESNETS_SK value, naming its key.
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "resnet_sk") -> None:
        super().__init__()
        self.model_config = model_config
        p = parse_trunk(ResNetSKParams, model_config, "RESNETS_SK")
        depth, width, sk_ratio = p.DEPTH, p.WIDTH_MULTIPLIER, p.SK_RATIO
        self.input_type = str(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        stages: list[nn.Module] = [Stem(input_channels(self.input_type), sk_ratio, width)]
        channels = 64 * width
        for i, n in enumerate(BLOCKS_PER_STAGE[depth]):
            stage = Blocks(n, channels, 64 * width * 2**i, 1 if i == 0 else 2, sk_ratio)
            channels = stage.channels_out
            stages.append(stage)
        self.net = nn.Sequential(*stages)
        self.output_dim = channels
        self._stage_names = ["conv1", "res2", "res3", "res4", "res5"]
        self.feature_names = ["flatten", "res5avg", *self._stage_names]
        self.use_checkpointing = checkpointing_on(model_config)
        logger.info(
            "Building ResNet-SK: depth %d, width x%d, SK ratio %s, output width %d",
            depth,
            width,
            sk_ratio,
            channels,
        )

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """The features named in ``out_feat_keys`` (default: ``flatten``).

        Raises:
            ConfigError: an unknown feature name.
        """
        names = resolve_features(out_feat_keys, self.feature_names, "flatten", "resnet_sk")
        pooled = "flatten" in names or "res5avg" in names
        last = 4 if pooled else max(self._stage_names.index(n) for n in names)
        feat = transform_model_input_data_type(x, self.input_type)
        out: dict[str, torch.Tensor] = {}
        for name, stage in zip(self._stage_names[: last + 1], self.net):
            feat = maybe_checkpoint(stage, self.use_checkpointing, self, feat)
            out[name] = feat
        if pooled:
            out["res5avg"] = feat.mean(dim=(2, 3), keepdim=True)
            out["flatten"] = torch.flatten(out["res5avg"], 1)
        return [out[n] for n in names]

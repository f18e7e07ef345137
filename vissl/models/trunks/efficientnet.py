"""Trunk ``efficientnet``: VISSL's EfficientNet-B0..B7 (ClassyVision's), built on timm.

Configured by MODEL.TRUNK.EFFICIENT_NETS, with VISSL's (ClassyVision's) keys:

- ``model_version``: B0 | B1 | ... | B7, the compound scaling of Tan & Le (2019): width
  and depth multipliers and the classifier dropout (B0: 1.0, 1.0, 0.2; B7: 2.0, 3.1, 0.5);
- ``bn_momentum`` (0.01, PyTorch's convention), ``bn_epsilon`` (1e-3);
- ``drop_connect_rate`` (0.2): stochastic depth, growing linearly with the block index
  from 0 (first block) to ``drop_connect_rate`` (as ClassyVision);
- ``width_divisor`` (8) and ``min_width`` (null: the divisor): channel counts are rounded
  to multiples of ``width_divisor``, never below ``min_width`` nor 10% below the scaled
  count;
- ``use_se`` (True): the squeeze-and-excitation of every block (ratio 0.25 of the
  block's input channels).

The network is EfficientNet-B0's seven stages of MBConv blocks (paper, table 1), scaled,
with TensorFlow's "same" padding, SiLU (swish) activations and ClassyVision's weight init
(normal, std sqrt(2 / (k * k * out_channels)), for every convolution). The padding is
computed from each input, so the trunk takes any input size (ClassyVision's took only
the version's resolution, 224 px for B0).

The timm model is the submodule ``timm_model`` (parameters ``timm_model.<timm name>``:
``conv_stem``, ``bn1``, ``blocks.<stage>.<block>.*``, ``conv_head``, ``bn2``), so its
weights are timm's ``tf_efficientnet_b*`` layout (`extra_scripts/export_trunk.py --format
timm`). VISSL checkpoints of this trunk hold ClassyVision's names and do not load as they
are.

Features (``out_feat_keys``), VISSL's names, in network order:

================  ==========================================  =====================
name              what                                        shape
================  ==========================================  =====================
conv1             stem: conv 3x3 / 2, BatchNorm, SiLU          N x 32w x H/2 x W/2
block{i}          MBConv block i (0..15 for B0, all stages)   N x C_i x h_i x w_i
conv_final        head conv 1x1, BatchNorm, SiLU              N x 1280w x H/32 x W/32
avgpool           global average pool                          N x 1280w x 1 x 1
flatten           the pool flattened                           N x 1280w
dropout           ``flatten`` through the version's dropout    N x 1280w
================  ==========================================  =====================

The default output (what the heads take) is the last one: ``dropout`` (``flatten`` when
the dropout is 0), as in VISSL. Its width ``output_dim`` is 1280 for B0 and B1.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

import torch
import torch.nn as nn

from vissl.config.params import OneOf, Positive, Unit
from vissl.models.model_helpers import cfg_get, input_channels, transform_model_input_data_type
from vissl.models.trunks import register_model_trunk
from vissl.models.trunks._trunk_params import (
    PosInt,
    Rate,
    checkpointing_on,
    import_timm,
    maybe_checkpoint,
    parse_trunk,
    resolve_features,
)

logger = logging.getLogger(__name__)


#: model_version -> (width multiplier, depth multiplier, resolution, dropout), Tan & Le.
VERSIONS: dict[str, tuple[float, float, int, float]] = {
    "B0": (1.0, 1.0, 224, 0.2),
    "B1": (1.0, 1.1, 240, 0.2),
    "B2": (1.1, 1.2, 260, 0.3),
    "B3": (1.2, 1.4, 300, 0.3),
    "B4": (1.4, 1.8, 380, 0.4),
    "B5": (1.6, 2.2, 456, 0.4),
    "B6": (1.8, 2.6, 528, 0.5),
    "B7": (2.0, 3.1, 600, 0.5),
}


@dataclass(kw_only=True, frozen=True)
class EfficientNetParams:
    """``config.MODEL.TRUNK.EFFICIENT_NETS`` (ClassyVision's EfficientNet arguments)."""

    model_version: Annotated[str, OneOf(*VERSIONS)] = "B0"
    bn_momentum: Annotated[float, Unit] = 0.01
    bn_epsilon: Annotated[float, Positive] = 0.001
    drop_connect_rate: Rate = 0.2
    width_divisor: PosInt = 8
    min_width: PosInt | None = None
    use_se: bool = True


# EfficientNet-B0's stages: (block, repeats, kernel, stride, expansion, output channels);
# "ds" is the depthwise-separable block of the first stage (expansion 1)
_B0_STAGES = (
    ("ds", 1, 3, 1, 1, 16),
    ("ir", 2, 3, 2, 6, 24),
    ("ir", 2, 5, 2, 6, 40),
    ("ir", 3, 3, 2, 6, 80),
    ("ir", 3, 5, 1, 6, 112),
    ("ir", 4, 5, 2, 6, 192),
    ("ir", 1, 3, 1, 6, 320),
)
_STEM_CHANNELS = 32
_HEAD_CHANNELS = 1280
_SE_RATIO = 0.25


def arch_def(use_se: bool) -> list[list[str]]:
    """The B0 stages as timm block strings (``ir_r2_k3_s2_e6_c24_se0.25``, ...)."""
    se = f"_se{_SE_RATIO}" if use_se else ""
    return [[f"{b}_r{r}_k{k}_s{s}_e{e}_c{c}{se}"] for b, r, k, s, e, c in _B0_STAGES]


def _classy_init(model: nn.Module) -> None:
    """ClassyVision's EfficientNet init: convolutions normal with std
    sqrt(2 / (k_h * k_w * out_channels)), zero biases, BatchNorm 1 and 0."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            kh, kw = module.kernel_size
            nn.init.normal_(module.weight, 0.0, math.sqrt(2.0 / (kh * kw * module.out_channels)))
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


@register_model_trunk("efficientnet")
class EfficientNet(nn.Module):
    """EfficientNet-B0..B7 with VISSL's feature taps.

    Args:
        model_config: config.MODEL; reads TRUNK.EFFICIENT_NETS, INPUT_TYPE and
            ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING (each block).
        model_name: the registry name (unused).

    Raises:
        ConfigError: a bad EFFICIENT_NETS value (naming its key), or timm is missing.
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "efficientnet") -> None:
        super().__init__()
        self.model_config = model_config
        p = parse_trunk(EfficientNetParams, model_config, "EFFICIENT_NETS")
        version = p.model_version
        width, depth, self.resolution, dropout = VERSIONS[version]
        momentum, eps, drop_connect = p.bn_momentum, p.bn_epsilon, p.drop_connect_rate
        divisor, min_width, use_se = p.width_divisor, p.min_width, p.use_se
        self.input_type = str(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        import_timm("efficientnet")
        from timm.models._efficientnet_builder import decode_arch_def, round_channels
        from timm.models.efficientnet import EfficientNet as TimmEfficientNet

        round_fn = partial(round_channels, multiplier=width, divisor=divisor, channel_min=min_width)
        self.timm_model = TimmEfficientNet(
            block_args=decode_arch_def(arch_def(use_se), depth, depth_trunc="ceil"),
            num_classes=0,
            num_features=round_fn(_HEAD_CHANNELS),
            in_chans=input_channels(self.input_type),
            stem_size=_STEM_CHANNELS,
            round_chs_fn=round_fn,
            pad_type="same",
            act_layer=nn.SiLU,
            norm_layer=partial(nn.BatchNorm2d, eps=eps, momentum=momentum),
            drop_rate=0.0,
            drop_path_rate=drop_connect,
        )
        _classy_init(self.timm_model)
        self.model_version = version
        self.output_dim = int(self.timm_model.num_features)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None
        num_blocks = len(self._blocks())
        self.feature_names = [
            "conv1",
            *(f"block{i}" for i in range(num_blocks)),
            "conv_final",
            "avgpool",
            "flatten",
            *(["dropout"] if self.dropout is not None else []),
        ]
        self.use_checkpointing = checkpointing_on(model_config)
        logger.info(
            "Building EfficientNet-%s: %d blocks, width %d, dropout %.2f, drop connect %.2f, SE %s",
            version,
            num_blocks,
            self.output_dim,
            dropout,
            drop_connect,
            use_se,
        )

    def _blocks(self) -> list[nn.Module]:
        """The MBConv blocks of every stage, in order (VISSL's ``block{i}``)."""
        stages: Any = self.timm_model.blocks
        return [block for stage in stages for block in stage]

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """The features named in ``out_feat_keys`` (default: the last, ``dropout``).

        The network runs only up to the deepest requested feature.

        Raises:
            ConfigError: an unknown feature name.
        """
        names = resolve_features(
            out_feat_keys, self.feature_names, self.feature_names[-1], "efficientnet"
        )
        last = max(self.feature_names.index(n) for n in names)
        wanted = set(names)
        out: dict[str, torch.Tensor] = {}
        m = self.timm_model
        feat = m.bn1(m.conv_stem(transform_model_input_data_type(x, self.input_type)))
        steps: list[tuple[str, Any]] = [
            *((f"block{i}", b) for i, b in enumerate(self._blocks())),
            ("conv_final", lambda t: m.bn2(m.conv_head(t))),
            ("avgpool", lambda t: t.mean((2, 3), keepdim=True)),
            ("flatten", lambda t: torch.flatten(t, 1)),
            ("dropout", self.dropout),
        ]
        out["conv1"] = feat
        for index, (name, step) in enumerate(steps, start=1):
            if index > last:
                break
            if name.startswith("block"):
                feat = maybe_checkpoint(step, self.use_checkpointing, self, feat)
            else:
                feat = step(feat)
            if name in wanted:
                out[name] = feat
        return [out[n] for n in names]

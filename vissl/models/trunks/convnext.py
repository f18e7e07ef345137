"""Trunk ``convnext``: VISSL's ConvNeXt (Liu et al. 2022), built on timm's ConvNeXt.

Configured by MODEL.TRUNK.CONVNEXT, VISSL's keys:

- ``DEPTH``: blocks per stage, 4 entries (VISSL's default [3, 3, 27, 3], ConvNeXt-S/B/L;
  [3, 3, 9, 3] is ConvNeXt-T);
- ``DIMS``: channels per stage, 4 entries ([96, 192, 384, 768]);
- ``DROP_PATH_RATE`` (0.0): stochastic depth, growing linearly over the blocks.

The network is the paper's: a 4x4 / 4 patchify stem with LayerNorm, four stages of
blocks (7x7 depthwise conv, LayerNorm, MLP x4 with GELU, layer scale 1e-6, residual),
a LayerNorm + 2x2 / 2 conv before stages 2-4, then global average pooling and a final
LayerNorm (eps 1e-6 everywhere), truncated-normal init (std 0.02), as VISSL's copy of
the official code. Any input size divisible by 32 works.

The timm model is the submodule ``timm_model`` (``timm_model.stem.*``,
``timm_model.stages.<i>.downsample.*``, ``timm_model.stages.<i>.blocks.<j>.{conv_dw, norm,
mlp.fc1, mlp.fc2, gamma}``, ``timm_model.head.norm.*``): timm's ``convnext_*`` layout,
so timm's ConvNeXt weights load through MODEL.WEIGHTS_INIT and the trunk exports to timm
(`extra_scripts/export_trunk.py --format timm`). VISSL checkpoints of this trunk hold the
official repository's names (``downsample_layers``, ``stages.<i>.<j>.dwconv``, ...) and
do not load as they are.

Features (``out_feat_keys``):

=========  ==========================================  ==========================
name       what                                        shape
=========  ==========================================  ==========================
pooled     global average pool + LayerNorm: the        N x DIMS[-1]
           default (VISSL's only output)
stage{i}   output of stage i (0..3)                    N x DIMS[i] x H/2^(i+2) x W/2^(i+2)
=========  ==========================================  ==========================

``lastCLS`` is an alias of ``pooled``: VISSL's ConvNeXt returned its one output whatever
the name, and VISSL's evaluation configs ask for ``lastCLS``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
import torch.nn as nn

from vissl.config.params import Length
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

NUM_STAGES = 4


@dataclass(kw_only=True, frozen=True)
class ConvNeXtParams:
    """``config.MODEL.TRUNK.CONVNEXT`` (VISSL's keys and defaults)."""

    DEPTH: Annotated[list[PosInt], Length(NUM_STAGES)] = field(
        default_factory=lambda: [3, 3, 27, 3]
    )
    DIMS: Annotated[list[PosInt], Length(NUM_STAGES)] = field(
        default_factory=lambda: [96, 192, 384, 768]
    )
    DROP_PATH_RATE: Rate = 0.0


POOLED = "pooled"
#: VISSL's evaluation configs name the pooled output so.
ALIASES = {"lastCLS": POOLED}
LAYER_SCALE_INIT = 1e-6


@register_model_trunk("convnext")
class ConvNeXt(nn.Module):
    """ConvNeXt with per-stage feature taps.

    Args:
        model_config: config.MODEL; reads TRUNK.CONVNEXT, INPUT_TYPE and
            ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING (each stage).
        model_name: the registry name (unused).

    Raises:
        ConfigError: a bad CONVNEXT value (naming its key), or timm is missing.
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "convnext") -> None:
        super().__init__()
        self.model_config = model_config
        p = parse_trunk(ConvNeXtParams, model_config, "CONVNEXT")
        depths, dims, drop_path = p.DEPTH, p.DIMS, p.DROP_PATH_RATE
        self.input_type = str(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        import_timm("convnext")
        from timm.models.convnext import ConvNeXt as TimmConvNeXt

        self.timm_model = TimmConvNeXt(
            in_chans=input_channels(self.input_type),
            num_classes=0,
            depths=tuple(depths),
            dims=tuple(dims),
            ls_init_value=LAYER_SCALE_INIT,
            drop_path_rate=drop_path,
        )
        self.output_dim = dims[-1]
        self.feature_names = [POOLED, *(f"stage{i}" for i in range(NUM_STAGES))]
        self.use_checkpointing = checkpointing_on(model_config)
        logger.info(
            "Building ConvNeXt: depths %s, dims %s, drop path %.2f", depths, dims, drop_path
        )

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """The features named in ``out_feat_keys`` (default: ``pooled``).

        Raises:
            ConfigError: an unknown feature name.
        """
        names = resolve_features(out_feat_keys, self.feature_names, POOLED, "convnext", ALIASES)
        last = NUM_STAGES - 1
        if POOLED not in names:
            last = max(int(n[len("stage") :]) for n in names)
        m = self.timm_model
        feat = m.stem(transform_model_input_data_type(x, self.input_type))
        out: dict[str, torch.Tensor] = {}
        for i, stage in enumerate(m.stages[: last + 1]):
            feat = maybe_checkpoint(stage, self.use_checkpointing, self, feat)
            out[f"stage{i}"] = feat
        if POOLED in names:
            out[POOLED] = m.forward_head(m.norm_pre(feat), pre_logits=True)
        return [out[n] for n in names]

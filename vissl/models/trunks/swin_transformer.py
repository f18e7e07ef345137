"""Trunk ``swin_transformer``: VISSL's Swin Transformer (Liu et al. 2021), built on timm.

Configured by MODEL.TRUNK.SWIN_TRANSFORMER, VISSL's keys (defaults: Swin-T):

- ``IMAGE_SIZE`` (224) and ``PATCH_SIZE`` (4): the size the windows are laid out for;
  other sizes work (multi-crop): images are zero-padded to a multiple of PATCH_SIZE,
  feature maps to a multiple of the window, and the shifted-window masks follow each
  input;
- ``EMBED_DIM`` (96): the width of stage 1, doubled at every stage;
- ``DEPTHS`` ([2, 2, 6, 2]) and ``NUM_HEADS`` ([3, 6, 12, 24]): blocks and attention
  heads per stage (one entry per stage, the same number of stages);
- ``WINDOW_SIZE`` (7), ``MLP_RATIO`` (4.0), ``QKV_BIAS`` (True);
- ``DROPOUT_RATE`` (0: after the patch embedding and in the blocks' projections and
  MLPs), ``ATTENTION_DROPOUT_RATE`` (0), ``DROP_PATH_RATE`` (0.1, growing linearly over
  the blocks);
- ``QK_SCALE``: False only (timm's attention scales by 1/sqrt(head dim));
- ``name``: read by nothing, in VISSL as here (kept so VISSL's configs compose).

The windows are laid out for IMAGE_SIZE: a stage whose map is then no larger than the
window gets one window of the map's size and no shift (as VISSL). Another input size
keeps that layout, its maps zero-padded to whole windows (VISSL shrank the window for
each input instead, so multi-crop's small crops see slightly different attention).
Parameter names are timm's, under ``timm_model.``
(``timm_model.patch_embed.proj``, ``timm_model.layers.<i>.downsample`` at the *start* of
stages 2-4, ``timm_model.layers.<i>.blocks.<j>.attn.relative_position_bias_table``,
``timm_model.norm``), so timm's Swin weights load through MODEL.WEIGHTS_INIT and the
trunk exports to timm. VISSL checkpoints of this trunk (the official repository's names,
with the downsampling at the *end* of stages 1-3) do not load as they are.

Features (``out_feat_keys``):

=========  ===============================================  ==============================
name       what                                             shape
=========  ===============================================  ==============================
pooled     final LayerNorm, then the mean over positions:   N x EMBED_DIM * 2^(stages-1)
           the default (VISSL's only output)
stage{i}   output of stage i (before the final norm)        N x EMBED_DIM * 2^i x h_i x w_i
=========  ===============================================  ==============================

``lastCLS`` is an alias of ``pooled`` (VISSL's evaluation configs use that name).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from vissl.config.params import NonEmpty, Positive
from vissl.models.model_helpers import cfg_get, input_channels, transform_model_input_data_type
from vissl.models.trunks import register_model_trunk
from vissl.models.trunks._trunk_params import (
    NoQKScale,
    PosInt,
    Rate,
    checkpointing_on,
    import_timm,
    maybe_checkpoint,
    parse_trunk,
    resolve_features,
    trunk_error,
)

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, frozen=True)
class SwinParams:
    """``config.MODEL.TRUNK.SWIN_TRANSFORMER`` (VISSL's keys and defaults, Swin-T).

    ``name`` is informational only. NUM_HEADS has one entry per stage of DEPTHS, and
    stage ``i``'s width (EMBED_DIM * 2^i) must be divisible by its heads.
    """

    name: str | None = None
    IMAGE_SIZE: PosInt = 224
    PATCH_SIZE: PosInt = 4
    EMBED_DIM: PosInt = 96
    DEPTHS: Annotated[list[PosInt], NonEmpty] = field(default_factory=lambda: [2, 2, 6, 2])
    NUM_HEADS: Annotated[list[PosInt], NonEmpty] = field(default_factory=lambda: [3, 6, 12, 24])
    WINDOW_SIZE: PosInt = 7
    MLP_RATIO: Annotated[float, Positive] = 4.0
    DROPOUT_RATE: Rate = 0.0
    ATTENTION_DROPOUT_RATE: Rate = 0.0
    DROP_PATH_RATE: Rate = 0.1
    QKV_BIAS: bool = True
    QK_SCALE: NoQKScale = False

    def check(self, key_path: str) -> None:
        heads, depths = self.NUM_HEADS, self.DEPTHS
        if len(heads) != len(depths):
            raise trunk_error(
                "SWIN_TRANSFORMER",
                "NUM_HEADS",
                heads,
                f"must have one entry per stage, as DEPTHS={depths} has.",
            )
        for i, h in enumerate(heads):
            width = self.EMBED_DIM * 2**i
            if width % h:
                raise trunk_error(
                    "SWIN_TRANSFORMER",
                    "NUM_HEADS",
                    heads,
                    f"stage {i} is {width} wide (EMBED_DIM * 2^{i}), which {h} heads do "
                    "not divide.",
                )


POOLED = "pooled"
ALIASES = {"lastCLS": POOLED}


@register_model_trunk("swin_transformer")
class SwinTransformer(nn.Module):
    """Swin Transformer with per-stage feature taps.

    Args:
        model_config: config.MODEL; reads TRUNK.SWIN_TRANSFORMER, INPUT_TYPE and
            ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING (each stage).
        model_name: the registry name (unused).

    Raises:
        ConfigError: a bad SWIN_TRANSFORMER value (naming its key), or timm is missing.
    """

    def __init__(
        self, model_config: Mapping[str, Any], model_name: str = "swin_transformer"
    ) -> None:
        super().__init__()
        self.model_config = model_config
        p = parse_trunk(SwinParams, model_config, "SWIN_TRANSFORMER")
        depths, heads, embed_dim = p.DEPTHS, p.NUM_HEADS, p.EMBED_DIM
        self.patch_size = p.PATCH_SIZE
        dropout = p.DROPOUT_RATE
        self.input_type = str(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        import_timm("swin_transformer")
        from timm.models.swin_transformer import SwinTransformer as TimmSwin

        self.timm_model = TimmSwin(
            img_size=p.IMAGE_SIZE,
            patch_size=self.patch_size,
            in_chans=input_channels(self.input_type),
            num_classes=0,
            embed_dim=embed_dim,
            depths=tuple(depths),
            num_heads=tuple(heads),
            window_size=p.WINDOW_SIZE,
            mlp_ratio=p.MLP_RATIO,
            qkv_bias=p.QKV_BIAS,
            drop_rate=0.0,
            proj_drop_rate=dropout,
            attn_drop_rate=p.ATTENTION_DROPOUT_RATE,
            drop_path_rate=p.DROP_PATH_RATE,
            strict_img_size=False,
        )
        # VISSL drops out after the patch embedding too; timm's Swin has no such dropout
        self.pos_drop = nn.Dropout(dropout)
        self.num_stages = len(depths)
        self.output_dim = int(self.timm_model.num_features)
        self.feature_names = [POOLED, *(f"stage{i}" for i in range(self.num_stages))]
        self.use_checkpointing = checkpointing_on(model_config)
        logger.info(
            "Building Swin Transformer: embed %d, depths %s, heads %s, window %s",
            embed_dim,
            depths,
            heads,
            p.WINDOW_SIZE,
        )

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """The features named in ``out_feat_keys`` (default: ``pooled``).

        Raises:
            ConfigError: an unknown feature name.
        """
        names = resolve_features(
            out_feat_keys, self.feature_names, POOLED, "swin_transformer", ALIASES
        )
        last = self.num_stages - 1
        if POOLED not in names:
            last = max(int(n[len("stage") :]) for n in names)
        x = transform_model_input_data_type(x, self.input_type)
        pad_h, pad_w = (-x.shape[-2]) % self.patch_size, (-x.shape[-1]) % self.patch_size
        if pad_h or pad_w:  # right / bottom zero padding, as VISSL
            x = F.pad(x, (0, pad_w, 0, pad_h))
        m = self.timm_model
        feat = self.pos_drop(m.patch_embed(x))  # N x h x w x C
        out: dict[str, torch.Tensor] = {}
        for i, layer in enumerate(m.layers[: last + 1]):
            feat = maybe_checkpoint(layer, self.use_checkpointing, self, feat)
            out[f"stage{i}"] = feat.permute(0, 3, 1, 2)
        if POOLED in names:
            out[POOLED] = m.norm(feat).mean(dim=(1, 2))
        return [out[n] for n in names]

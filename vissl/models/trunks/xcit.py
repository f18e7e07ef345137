"""Trunk ``xcit``: VISSL's XCiT, cross-covariance image transformer (El-Nouby et al.
2021), built on timm's Xcit.

Configured by MODEL.TRUNK.XCIT, VISSL's keys (defaults: XCiT-S12/16):

- ``IMAGE_SIZE`` (224), ``PATCH_SIZE`` (16; 8 or 16: the convolutional patch embedding
  has 4 or 3 stride-2 3x3 convolutions); any input size divisible by PATCH_SIZE works
  (the Fourier position encoding is computed for each input);
- ``HIDDEN_DIM`` (384), ``NUM_LAYERS`` (12 XCA blocks; 2 class-attention blocks follow),
  ``NUM_HEADS`` (8), ``MLP_RATIO`` (4.0), ``QKV_BIAS`` (True);
- ``DROPOUT_RATE`` (0: after the position encoding and in the projections and MLPs),
  ``ATTENTION_DROPOUT_RATE`` (0), ``DROP_PATH_RATE`` (0.05, the same for every XCA
  block, as in XCiT);
- ``ETA`` (1): the layer-scale init; ``TOKENS_NORM`` (True): the class-attention blocks
  normalise every token (False: the class token only);
- ``CHECKPOINT_XCA_BLOCK`` / ``CHECKPOINT_ATTN_BLOCK`` (False): activation checkpointing
  of the XCA / class-attention blocks (VISSL: its FSDP variant only; here always);
- ``QK_SCALE``: False only (timm's class attention scales by 1/sqrt(head dim)); ``name``:
  read by nothing, in VISSL as here.

Parameter names are timm's (the official XCiT names, but ``pos_embed`` for the official
``pos_embeder``), under ``timm_model.`` (``timm_model.patch_embed.proj.*``,
``timm_model.cls_token``, ``timm_model.blocks.<i>.{norm1, attn.temperature, attn.qkv,
local_mp, mlp, gamma1..3}``, ``timm_model.cls_attn_blocks.<i>.*``, ``timm_model.norm``),
so timm's XCiT weights load through MODEL.WEIGHTS_INIT and the trunk exports to timm.
VISSL checkpoints need ``pos_embeder`` renamed and the ``timm_model.`` prefix.

Features (``out_feat_keys``; the token outputs go through the final LayerNorm):

=========  ===================================================  =================
name       what                                                 shape
=========  ===================================================  =================
lastCLS    the class token after the class-attention blocks:    N x HIDDEN_DIM
           the default (VISSL's)
lastPOOL   the mean of the final patch tokens                   N x HIDDEN_DIM
lastMAP    the final patch tokens as a map (VISSL's was         N x HIDDEN_DIM x h x w
           N x h x w x D; channels first here, for pooling)
blkMAP{i}  the patch tokens after XCA block i, as a map         N x HIDDEN_DIM x h x w
=========  ===================================================  =================
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn as nn

from vissl.config.params import OneOf, Positive
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
    tokens_to_map,
    trunk_error,
)

logger = logging.getLogger(__name__)

PATCH_SIZES = (8, 16)


@dataclass(kw_only=True, frozen=True)
class XCiTParams:
    """``config.MODEL.TRUNK.XCIT`` (VISSL's keys and defaults, XCiT-S12/16).

    ``name`` is informational only. IMAGE_SIZE must be a multiple of PATCH_SIZE and
    HIDDEN_DIM divisible by NUM_HEADS.
    """

    name: str | None = None
    IMAGE_SIZE: PosInt = 224
    PATCH_SIZE: Annotated[int, OneOf(*PATCH_SIZES)] = 16
    HIDDEN_DIM: PosInt = 384
    NUM_LAYERS: PosInt = 12
    NUM_HEADS: PosInt = 8
    MLP_RATIO: Annotated[float, Positive] = 4.0
    DROPOUT_RATE: Rate = 0.0
    ATTENTION_DROPOUT_RATE: Rate = 0.0
    DROP_PATH_RATE: Rate = 0.05
    ETA: Annotated[float, Positive] = 1.0
    TOKENS_NORM: bool = True
    QKV_BIAS: bool = True
    QK_SCALE: NoQKScale = False
    CHECKPOINT_XCA_BLOCK: bool = False
    CHECKPOINT_ATTN_BLOCK: bool = False

    def check(self, key_path: str) -> None:
        if self.IMAGE_SIZE % self.PATCH_SIZE:
            raise trunk_error(
                "XCIT",
                "IMAGE_SIZE",
                self.IMAGE_SIZE,
                f"must be a multiple of PATCH_SIZE={self.PATCH_SIZE}.",
            )
        if self.HIDDEN_DIM % self.NUM_HEADS:
            raise trunk_error(
                "XCIT",
                "HIDDEN_DIM",
                self.HIDDEN_DIM,
                f"must be divisible by NUM_HEADS={self.NUM_HEADS}.",
            )


FINAL = ("lastCLS", "lastPOOL", "lastMAP")


@register_model_trunk("xcit")
class XCiT(nn.Module):
    """XCiT with VISSL's feature names.

    Args:
        model_config: config.MODEL; reads TRUNK.XCIT, INPUT_TYPE and
            ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING (every block).
        model_name: the registry name (unused).

    Raises:
        ConfigError: a bad XCIT value (naming its key), or timm is missing.
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "xcit") -> None:
        super().__init__()
        self.model_config = model_config
        p = parse_trunk(XCiTParams, model_config, "XCIT")
        image_size, self.patch_size = p.IMAGE_SIZE, p.PATCH_SIZE
        dim, heads, depth, dropout = p.HIDDEN_DIM, p.NUM_HEADS, p.NUM_LAYERS, p.DROPOUT_RATE
        all_blocks = checkpointing_on(model_config)
        self.checkpoint_xca = p.CHECKPOINT_XCA_BLOCK or all_blocks
        self.checkpoint_attn = p.CHECKPOINT_ATTN_BLOCK or all_blocks
        self.input_type = str(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        import_timm("xcit")
        from timm.models.xcit import Xcit

        self.timm_model = Xcit(
            img_size=image_size,
            patch_size=self.patch_size,
            in_chans=input_channels(self.input_type),
            num_classes=0,
            embed_dim=dim,
            depth=depth,
            num_heads=heads,
            mlp_ratio=p.MLP_RATIO,
            qkv_bias=p.QKV_BIAS,
            drop_rate=0.0,
            pos_drop_rate=dropout,
            proj_drop_rate=dropout,
            attn_drop_rate=p.ATTENTION_DROPOUT_RATE,
            drop_path_rate=p.DROP_PATH_RATE,
            eta=p.ETA,
            tokens_norm=p.TOKENS_NORM,
        )
        self.output_dim = dim
        self.num_layers = depth
        self.feature_names = [*FINAL, *(f"blkMAP{i}" for i in range(depth))]
        logger.info(
            "Building XCiT: %d px, patch %d, width %d, %d XCA blocks, %d heads",
            image_size,
            self.patch_size,
            dim,
            depth,
            heads,
        )

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """The features named in ``out_feat_keys`` (default: ``lastCLS``).

        Raises:
            ConfigError: an unknown feature name.
            ValueError: image sides that are not multiples of PATCH_SIZE.
        """
        names = resolve_features(out_feat_keys, self.feature_names, "lastCLS", "xcit")
        height, width = x.shape[-2:]
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(
                f"xcit got {height}x{width} px images; both sides must be multiples of "
                f"config.MODEL.TRUNK.XCIT.PATCH_SIZE={self.patch_size}: crop or resize them."
            )
        needs_final = any(n in FINAL for n in names)
        blocks = [int(n[len("blkMAP") :]) for n in names if n.startswith("blkMAP")]
        last = self.num_layers - 1 if needs_final else max(blocks)
        m = self.timm_model
        tokens, (hp, wp) = m.patch_embed(transform_model_input_data_type(x, self.input_type))
        if m.pos_embed is not None:
            pos = m.pos_embed(tokens.shape[0], hp, wp)  # N x D x hp x wp
            tokens = tokens + pos.reshape(tokens.shape[0], -1, tokens.shape[1]).permute(0, 2, 1)
        tokens = m.pos_drop(tokens)
        out: dict[str, torch.Tensor] = {}
        for i, block in enumerate(m.blocks[: last + 1]):
            tokens = maybe_checkpoint(block, self.checkpoint_xca, self, tokens, hp, wp)
            if i in blocks:
                out[f"blkMAP{i}"] = tokens_to_map(m.norm(tokens), (hp, wp))
        if needs_final:
            tokens = torch.cat((m.cls_token.expand(tokens.shape[0], -1, -1), tokens), dim=1)
            for block in m.cls_attn_blocks:
                tokens = maybe_checkpoint(block, self.checkpoint_attn, self, tokens)
            tokens = m.norm(tokens)
            out["lastCLS"] = tokens[:, 0]
            out["lastPOOL"] = tokens[:, 1:].mean(dim=1)
            out["lastMAP"] = tokens_to_map(tokens[:, 1:], (hp, wp))
        return [out[n] for n in names]

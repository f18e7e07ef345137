"""Trunk ``beit``: VISSL's BEiT vision transformer (Bao et al. 2021), built on timm's Beit.

Configured by MODEL.TRUNK.BEIT, VISSL's keys (defaults: ViT-B/16):

- ``IMAGE_SIZE`` (224), ``PATCH_SIZE`` (16): the input must be IMAGE_SIZE square (the
  position embedding and relative position tables are made for it, as in VISSL);
- ``NUM_LAYERS`` (12), ``NUM_HEADS`` (12), ``HIDDEN_DIM`` (768), ``MLP_RATIO`` (4.0);
- ``DROPOUT_RATE`` (0: after the embedding and in the projections and MLPs),
  ``ATTENTION_DROPOUT_RATE`` (0), ``DROP_PATH_RATE`` (0, growing linearly over blocks);
- ``QKV_BIAS`` (False): learned query and value biases (BEiT has no key bias);
- ``USE_ABS_POS_EMB`` (True), ``USE_REL_POS_BIAS`` (False: a relative position bias in
  every block), ``USE_SHARED_REL_POS_BIAS`` (False: one shared by all blocks);
- ``USE_MEAN_POOLING`` (True): the output is the LayerNorm of the mean of the patch
  tokens (``fc_norm``) and the blocks have no final norm; False: a final LayerNorm and
  the class token;
- ``INIT_VALUES`` (False): layer scale (``gamma_1``, ``gamma_2``) starting at this
  value; False or 0: none;
- ``QK_SCALE``: False only (timm's attention scales by 1/sqrt(head dim)).

LayerNorm eps 1e-6, truncated-normal init (std 0.02) with the attention and MLP output
projections of block l divided by sqrt(2 l), as BEiT and VISSL.

Parameter names are the BEiT repository's, which timm keeps, under ``timm_model.``
(``timm_model.cls_token``, ``timm_model.pos_embed``, ``timm_model.patch_embed.proj``,
``timm_model.blocks.<i>.{norm1, attn.qkv, attn.q_bias, attn.v_bias,
attn.relative_position_bias_table, attn.proj, norm2, mlp.fc1, mlp.fc2, gamma_1,
gamma_2}``, ``timm_model.norm`` / ``timm_model.fc_norm``): timm's and the BEiT
repository's weights load through MODEL.WEIGHTS_INIT (the official files' buffers
``relative_position_index`` aside), and the trunk exports to timm.

Features (``out_feat_keys``; token outputs go through ``norm``, which is the identity
when USE_MEAN_POOLING is on, as in VISSL):

==============  ===============================================  ===================
name            what                                             shape
==============  ===============================================  ===================
lastPOOL        ``fc_norm`` of the mean of the last patch tokens N x HIDDEN_DIM
                (USE_MEAN_POOLING: the default)
lastCLS         the last block's class token (default without   N x HIDDEN_DIM
                USE_MEAN_POOLING)
lastMAP         the last block's patch tokens as a map           N x D x h x w
blkCLS{i}       the class token of block i (VISSL's name)        N x HIDDEN_DIM
concatCLS{n}    the class tokens of the last n blocks            N x n HIDDEN_DIM
==============  ===============================================  ===================

A difference from VISSL: with USE_MEAN_POOLING VISSL's BEiT returned the un-normalised
class token by default (its ``forward_features``); here the default is the mean-pooled
feature the option names (the BEiT paper's and timm's).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Literal

import torch
import torch.nn as nn

from vissl.config.params import NonNegative, Note, Positive
from vissl.errors import ConfigError
from vissl.models.model_helpers import cfg_get, input_channels, transform_model_input_data_type
from vissl.models.trunks import register_model_trunk
from vissl.models.trunks._trunk_params import (
    FEATURES_KEY,
    NoQKScale,
    PosInt,
    Rate,
    checkpointing_on,
    import_timm,
    maybe_checkpoint,
    parse_trunk,
    tokens_to_map,
    trunk_error,
)

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, frozen=True)
class BEiTParams:
    """``config.MODEL.TRUNK.BEIT`` (VISSL's keys and defaults, ViT-B/16).

    IMAGE_SIZE must be a multiple of PATCH_SIZE and HIDDEN_DIM divisible by NUM_HEADS.
    INIT_VALUES is the layer-scale init: False, null or 0 turn layer scale off.
    """

    IMAGE_SIZE: PosInt = 224
    PATCH_SIZE: PosInt = 16
    NUM_LAYERS: PosInt = 12
    NUM_HEADS: PosInt = 12
    HIDDEN_DIM: PosInt = 768
    MLP_RATIO: Annotated[float, Positive] = 4.0
    DROPOUT_RATE: Rate = 0.0
    ATTENTION_DROPOUT_RATE: Rate = 0.0
    DROP_PATH_RATE: Rate = 0.0
    QKV_BIAS: bool = False
    QK_SCALE: NoQKScale = False
    USE_ABS_POS_EMB: bool = True
    USE_REL_POS_BIAS: bool = False
    USE_SHARED_REL_POS_BIAS: bool = False
    USE_MEAN_POOLING: bool = True
    INIT_VALUES: Annotated[
        Literal[False] | Annotated[float, NonNegative] | None,
        Note("the layer-scale init; False, null or 0 turn layer scale off"),
    ] = False

    def check(self, key_path: str) -> None:
        if self.IMAGE_SIZE % self.PATCH_SIZE:
            raise trunk_error(
                "BEIT",
                "IMAGE_SIZE",
                self.IMAGE_SIZE,
                f"must be a multiple of PATCH_SIZE={self.PATCH_SIZE}.",
            )
        if self.HIDDEN_DIM % self.NUM_HEADS:
            raise trunk_error(
                "BEIT",
                "HIDDEN_DIM",
                self.HIDDEN_DIM,
                f"must be divisible by NUM_HEADS={self.NUM_HEADS}.",
            )


LAYER_NORM_EPS = 1e-6
_NAME = re.compile(r"^(lastPOOL|lastCLS|lastMAP|blkCLS(\d+)|concatCLS(\d+))$")


@register_model_trunk("beit")
class BEiT(nn.Module):
    """BEiT with VISSL's feature names.

    Args:
        model_config: config.MODEL; reads TRUNK.BEIT, INPUT_TYPE and
            ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING (every block).
        model_name: the registry name (unused).

    Raises:
        ConfigError: a bad BEIT value (naming its key), or timm is missing.
    """

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "beit") -> None:
        super().__init__()
        self.model_config = model_config
        p = parse_trunk(BEiTParams, model_config, "BEIT")
        self.image_size, patch = p.IMAGE_SIZE, p.PATCH_SIZE
        dim, heads, dropout = p.HIDDEN_DIM, p.NUM_HEADS, p.DROPOUT_RATE
        layer_scale = p.INIT_VALUES or None
        self.mean_pooling = p.USE_MEAN_POOLING
        self.num_layers = p.NUM_LAYERS
        self.input_type = str(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        import_timm("beit")
        from timm.models.beit import Beit

        self.timm_model = Beit(
            img_size=self.image_size,
            patch_size=patch,
            in_chans=input_channels(self.input_type),
            num_classes=0,
            global_pool="avg" if self.mean_pooling else "token",
            embed_dim=dim,
            depth=self.num_layers,
            num_heads=heads,
            qkv_bias=p.QKV_BIAS,
            mlp_ratio=p.MLP_RATIO,
            drop_rate=0.0,
            pos_drop_rate=dropout,
            proj_drop_rate=dropout,
            attn_drop_rate=p.ATTENTION_DROPOUT_RATE,
            drop_path_rate=p.DROP_PATH_RATE,
            norm_layer=partial(nn.LayerNorm, eps=LAYER_NORM_EPS),  # type: ignore[arg-type]
            init_values=layer_scale,
            use_abs_pos_emb=p.USE_ABS_POS_EMB,
            use_rel_pos_bias=p.USE_REL_POS_BIAS,
            use_shared_rel_pos_bias=p.USE_SHARED_REL_POS_BIAS,
        )
        self.grid = (self.image_size // patch, self.image_size // patch)
        self.output_dim = dim
        self.default_feature = "lastPOOL" if self.mean_pooling else "lastCLS"
        self.use_checkpointing = checkpointing_on(model_config)
        logger.info(
            "Building BEiT: %d px, patch %d, width %d, %d blocks, %d heads, default output %s",
            self.image_size,
            patch,
            dim,
            self.num_layers,
            heads,
            self.default_feature,
        )

    def _blocks_of(self, name: str) -> list[int]:
        """The block indices feature ``name`` reads.

        Raises:
            ConfigError: not a BEiT feature name, or a block out of range.
        """
        match = _NAME.match(name) if isinstance(name, str) else None
        n = self.num_layers
        if match is not None:
            if match.group(2) is not None and int(match.group(2)) < n:
                return [int(match.group(2))]
            if match.group(3) is not None and 1 <= int(match.group(3)) <= n:
                return list(range(n - int(match.group(3)), n))
            if match.group(2) is None and match.group(3) is None:
                return [n - 1]
        raise ConfigError(
            f"the beit trunk ({n} blocks) has no feature named {name!r}; its features are "
            f"lastPOOL, lastCLS, lastMAP, blkCLS<i> (i in 0..{n - 1}) and concatCLS<n> "
            f"(n in 1..{n}). Fix the names in {FEATURES_KEY}.",
            FEATURES_KEY,
        )

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """The features named in ``out_feat_keys`` (default: ``lastPOOL`` with
        USE_MEAN_POOLING, else ``lastCLS``).

        Raises:
            ConfigError: an unknown feature name.
            ValueError: an input of another size than IMAGE_SIZE.
        """
        names = list(out_feat_keys) if out_feat_keys else [self.default_feature]
        needed = [(name, self._blocks_of(name)) for name in names]
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(
                f"beit got {tuple(x.shape[-2:])} px images but is built for "
                f"config.MODEL.TRUNK.BEIT.IMAGE_SIZE={self.image_size}: crop or resize the "
                "images to that size (the position embeddings are made for it)."
            )
        wanted = {i for _, blocks in needed for i in blocks}
        m = self.timm_model
        tokens = m.patch_embed(transform_model_input_data_type(x, self.input_type))
        tokens = torch.cat((m.cls_token.expand(tokens.shape[0], -1, -1), tokens), dim=1)
        if m.pos_embed is not None:
            tokens = tokens + m.pos_embed
        tokens = m.pos_drop(tokens)
        shared_bias = m.rel_pos_bias() if m.rel_pos_bias is not None else None
        normed: dict[int, torch.Tensor] = {}
        for i, block in enumerate(m.blocks[: max(wanted) + 1]):
            tokens = maybe_checkpoint(
                partial(block, shared_rel_pos_bias=shared_bias),
                self.use_checkpointing,
                self,
                tokens,
            )
            if i in wanted:
                normed[i] = m.norm(tokens)
        out = []
        for name, blocks in needed:
            last = normed[blocks[-1]]
            if name == "lastPOOL":
                out.append(m.fc_norm(last[:, 1:].mean(dim=1)))
            elif name == "lastMAP":
                out.append(tokens_to_map(last[:, 1:], self.grid))
            else:
                out.append(torch.cat([normed[i][:, 0] for i in blocks], dim=-1))
        return out

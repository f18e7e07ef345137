"""``mae_decoder``: MAE's lightweight decoder (He et al., *Masked Autoencoders Are Scalable
Vision Learners*, CVPR 2022, section 3).

The encoder (``vision_transformer`` with ``MASKED_IMAGE_MODELING.NAME: mae``) saw the
visible patches only; its ``lastBLK`` feature is ``[class token, visible patch tokens]``
(``N x (1 + V) x D``, the patches in increasing patch order). The decoder

1. projects the tokens to ``decoder_dim`` (``decoder_embed``),
2. puts every visible token back at its patch position and fills the masked positions
   with the shared learned ``mask_token`` (the mask tells which is which),
3. adds the fixed 2-D sin-cos position embedding of the patch grid (zeros for the class
   token), as MAE does,
4. runs ``decoder_depth`` pre-norm transformer blocks (the trunk's own ``Block``,
   attention through ``scaled_dot_product_attention``) and ``decoder_norm``,
5. predicts each patch's ``patch_size * patch_size * C`` pixel values (``decoder_pred``)
   and drops the class token.

Output: ``(N, h * w, patch_size^2 * C)`` for every patch, visible ones included (the loss,
``mae_loss``, uses the masked ones). The parameter names are MAE's (``decoder_embed``,
``mask_token``, ``decoder_blocks``, ``decoder_norm``, ``decoder_pred``).

It needs the mask besides the trunk feature: map it with
``MULTI_INPUT_HEAD_MAPPING: [["data", {"feat_names": ["lastBLK"], "additional_keys":
["mask"]}]]``; the model passes ``mask`` to this head's ``forward``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn as nn

from vissl.config.params import IntAtLeast, Note
from vissl.errors import ConfigError
from vissl.models.heads import parse_head, register_model_head
from vissl.models.model_helpers import cfg_get, input_channels
from vissl.models.token_masking import (
    gather_tokens,
    restore_indices,
    sincos_2d_position_embedding,
)
from vissl.models.trunks.vision_transformer import LAYER_NORM_EPS, Block

_KEY = "config.MODEL.HEAD.PARAMS"


PosInt = Annotated[int, IntAtLeast(1)]


@dataclass(kw_only=True, frozen=True)
class MAEDecoderParams:
    """mae_decoder's arguments (MAE's defaults; null: from the trunk / input, see
    :class:`MAEDecoder`); ``decoder_dim`` must be divisible by ``decoder_num_heads`` and
    by 4 (the 2-D sin-cos position embedding)."""

    in_dim: PosInt
    decoder_dim: PosInt = 512
    decoder_depth: PosInt = 8
    decoder_num_heads: PosInt = 16
    decoder_mlp_dim: Annotated[PosInt | None, Note("null: 4 * decoder_dim")] = None
    patch_size: Annotated[PosInt | None, Note("null: the trunk's PATCH_SIZE")] = None
    in_chans: Annotated[PosInt | None, Note("null: from MODEL.INPUT_TYPE")] = None
    class_token: Annotated[bool | None, Note("null: the trunk's USE_CLASS_TOKEN")] = None
    qkv_bias: bool = True

    def check(self, key_path: str) -> None:
        if self.decoder_dim % self.decoder_num_heads or self.decoder_dim % 4:
            raise ConfigError(
                f"{key_path}.decoder_dim={self.decoder_dim} must be divisible by "
                f"decoder_num_heads={self.decoder_num_heads} and by 4 (the 2-D sin-cos "
                "position embedding).",
                f"{key_path}.decoder_dim",
            )


@register_model_head("mae_decoder")
class MAEDecoder(nn.Module):
    """MAE's decoder (see the module docstring).

    Args:
        model_config: config.MODEL; the trunk's PATCH_SIZE, USE_CLASS_TOKEN and INPUT_TYPE
            give the defaults below.
        in_dim: the encoder's width (HIDDEN_DIM).
        decoder_dim: the decoder's token width (MAE: 512).
        decoder_depth: decoder blocks (MAE: 8).
        decoder_num_heads: attention heads per decoder block (MAE: 16).
        decoder_mlp_dim: hidden width of the decoder MLPs; default ``4 * decoder_dim``.
        patch_size: the patch side in pixels; default the trunk's PATCH_SIZE.
        in_chans: image channels predicted per pixel; default from MODEL.INPUT_TYPE (3).
        class_token: whether the encoder's tokens start with a class token; default the
            trunk's USE_CLASS_TOKEN.
        qkv_bias: biases in the decoder's query/key/value projections (MAE: True).
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        in_dim: int,
        decoder_dim: int = MAEDecoderParams.decoder_dim,
        decoder_depth: int = MAEDecoderParams.decoder_depth,
        decoder_num_heads: int = MAEDecoderParams.decoder_num_heads,
        decoder_mlp_dim: int | None = MAEDecoderParams.decoder_mlp_dim,
        patch_size: int | None = MAEDecoderParams.patch_size,
        in_chans: int | None = MAEDecoderParams.in_chans,
        class_token: bool | None = MAEDecoderParams.class_token,
        qkv_bias: bool = MAEDecoderParams.qkv_bias,
    ) -> None:
        super().__init__()
        vit = cfg_get(model_config, "TRUNK.VISION_TRANSFORMERS", {}) or {}
        channels = input_channels(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        p = parse_head(
            MAEDecoderParams,
            "mae_decoder",
            {
                "in_dim": in_dim,
                "decoder_dim": decoder_dim,
                "decoder_depth": decoder_depth,
                "decoder_num_heads": decoder_num_heads,
                "decoder_mlp_dim": decoder_mlp_dim,
                # the trunk's and the input's values, checked as if given
                "patch_size": vit.get("PATCH_SIZE", 16) if patch_size is None else patch_size,
                "in_chans": channels if in_chans is None else in_chans,
                "class_token": class_token,
                "qkv_bias": qkv_bias,
            },
        )
        in_dim, self.decoder_dim, decoder_dim = p.in_dim, p.decoder_dim, p.decoder_dim
        depth, heads, qkv_bias = p.decoder_depth, p.decoder_num_heads, p.qkv_bias
        mlp_dim = 4 * decoder_dim if p.decoder_mlp_dim is None else p.decoder_mlp_dim
        assert p.patch_size is not None and p.in_chans is not None  # given above
        self.patch_size, self.in_chans = p.patch_size, p.in_chans
        self.num_prefix_tokens = int(
            bool(vit.get("USE_CLASS_TOKEN", True) if class_token is None else class_token)
        )
        self.decoder_embed = nn.Linear(in_dim, decoder_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_dim))
        self.decoder_blocks = nn.ModuleList(
            Block(decoder_dim, heads, mlp_dim, qkv_bias=bool(qkv_bias)) for _ in range(depth)
        )
        self.decoder_norm = nn.LayerNorm(decoder_dim, eps=LAYER_NORM_EPS)
        self.decoder_pred = nn.Linear(decoder_dim, self.patch_size**2 * self.in_chans)
        self._pos_cache: dict[tuple[int, int, torch.device], torch.Tensor] = {}
        self._init_weights()

    def _init_weights(self) -> None:
        """MAE's: Xavier-uniform Linear weights, zero biases, unit LayerNorms, the mask
        token normal with std 0.02."""
        nn.init.normal_(self.mask_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def position_embedding(self, grid: tuple[int, int], device: torch.device) -> torch.Tensor:
        """The fixed sin-cos embedding of a ``grid`` of patches, ``(h * w, decoder_dim)``
        (computed once per grid and device)."""
        key = (grid[0], grid[1], device)
        pos = self._pos_cache.get(key)
        if pos is None:
            pos = sincos_2d_position_embedding(grid[0], grid[1], self.decoder_dim).to(device)
            self._pos_cache[key] = pos
        return pos

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Predict the pixels of every patch.

        Args:
            x: the encoder's ``[class token,] visible patch tokens``, ``(N, P + V, in_dim)``.
            mask: the patch mask, ``(N, h, w)`` (or ``(N, h * w)`` for a square grid),
                True = masked; each row hides ``h * w - V`` patches.

        Returns:
            ``(N, h * w, patch_size^2 * in_chans)``.
        """
        n = x.shape[0]
        if mask.ndim == 3:
            grid = (int(mask.shape[1]), int(mask.shape[2]))
        else:
            side = round(mask.shape[1] ** 0.5)
            grid = (side, side)
        flat = mask.reshape(n, -1).to(device=x.device, dtype=torch.bool)
        length = flat.shape[1]
        num_visible = x.shape[1] - self.num_prefix_tokens
        if grid[0] * grid[1] != length or not 0 < num_visible <= length:
            raise ValueError(
                f"mae_decoder got {x.shape[1]} tokens ({self.num_prefix_tokens} class token) "
                f"for a mask of shape {tuple(mask.shape)}: give it the encoder's lastBLK "
                "feature on the visible patches and the (N, h, w) mask the encoder used."
            )
        y = self.decoder_embed(x)
        prefix, visible = y[:, : self.num_prefix_tokens], y[:, self.num_prefix_tokens :]
        masked = self.mask_token.to(y.dtype).expand(n, length - num_visible, -1)
        patches = gather_tokens(torch.cat((visible, masked), dim=1), restore_indices(flat))
        patches = patches + self.position_embedding(grid, y.device).to(y.dtype)
        tokens = torch.cat((prefix, patches), dim=1)
        for block in self.decoder_blocks:
            tokens = block(tokens)
        tokens = self.decoder_norm(tokens)
        return self.decoder_pred(tokens[:, self.num_prefix_tokens :])

    def extra_repr(self) -> str:
        return (
            f"patch_size={self.patch_size}, in_chans={self.in_chans}, "
            f"class_token={bool(self.num_prefix_tokens)}"
        )

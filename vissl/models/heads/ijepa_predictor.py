"""``ijepa_predictor``: I-JEPA's narrow predictor ViT (Assran et al., *Self-Supervised
Learning from Images with a Joint-Embedding Predictive Architecture*, CVPR 2023, section 3).

The context encoder (``vision_transformer`` with ``MASKED_IMAGE_MODELING.NAME: mae``) saw
the context patches only; its ``lastPATCH`` feature holds their tokens (``N x K_c x D``, in
increasing patch order). For each of the ``M`` target blocks the predictor

1. projects the context tokens to ``predictor_dim`` (``predictor_embed``) and adds the
   fixed 2-D sin-cos position embedding of their patches,
2. appends one token per patch of the target block: the shared learned ``mask_token``
   plus the position embedding of that patch,
3. runs ``depth`` pre-norm transformer blocks (the trunk's own ``Block``) and
   ``predictor_norm`` over the ``K_c + K_t`` tokens,
4. projects the target tokens back to the encoder's width (``predictor_proj``).

Output: ``(M * N, K_t, D)``, block-major (block 0 of every image, then block 1, ...), the
target patches of each block in increasing patch order: the order in which ``ijepa_loss``
takes the target encoder's tokens. Parameter names are I-JEPA's (``predictor_embed``,
``mask_token``, ``predictor_blocks``, ``predictor_norm``, ``predictor_proj``); the
initialisation too (truncated normal, std 0.02, and each block's output projections
divided by ``sqrt(2 * layer)``).

It needs both masks besides the trunk feature: map them with
``MULTI_INPUT_HEAD_MAPPING: [["data", {"feat_names": ["lastPATCH"], "additional_keys":
["mask", "target_masks"]}]]``; the trunk takes ``mask``, this head both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn as nn

from vissl.config.params import IntAtLeast, Positive, UnitOpen
from vissl.errors import ConfigError
from vissl.models.heads import parse_head, register_model_head
from vissl.models.token_masking import gather_tokens, keep_indices, sincos_2d_position_embedding
from vissl.models.trunks.vision_transformer import LAYER_NORM_EPS, Block

_KEY = "config.MODEL.HEAD.PARAMS"


PosInt = Annotated[int, IntAtLeast(1)]


@dataclass(kw_only=True, frozen=True)
class IJEPAPredictorParams:
    """ijepa_predictor's arguments (I-JEPA's defaults); ``predictor_dim`` must be divisible
    by ``num_heads`` and by 4 (the 2-D sin-cos position embedding)."""

    in_dim: PosInt
    predictor_dim: PosInt = 384
    depth: PosInt = 6
    num_heads: PosInt = 12
    mlp_ratio: Annotated[float, Positive] = 4.0
    qkv_bias: bool = True
    drop_path_rate: Annotated[float, UnitOpen] = 0.0

    def check(self, key_path: str) -> None:
        if self.predictor_dim % self.num_heads or self.predictor_dim % 4:
            raise ConfigError(
                f"{key_path}.predictor_dim={self.predictor_dim} must be divisible by "
                f"num_heads={self.num_heads} and by 4 (the 2-D sin-cos position embedding).",
                f"{key_path}.predictor_dim",
            )


def equal_row_count(mask: torch.Tensor, what: str) -> int:
    """The number of True entries of each row of a flat boolean ``mask``; one host read.

    Raises:
        ValueError: rows with different counts, or an empty row.
    """
    counts = mask.sum(dim=1)
    low, high = torch.stack(torch.aminmax(counts)).tolist()
    if low != high or low == 0:
        raise ValueError(
            f"ijepa_predictor: the {what} hold between {low} and {high} patches; every one "
            "must hold the same number (> 0). ijepa_multiblock_collator truncates them so."
        )
    return int(low)


@register_model_head("ijepa_predictor")
class IJEPAPredictor(nn.Module):
    """I-JEPA's predictor (see the module docstring).

    Args:
        model_config: config.MODEL (unused; the registry's constructor signature).
        in_dim: the encoder's width (HIDDEN_DIM).
        predictor_dim: the predictor's token width (I-JEPA: 384).
        depth: predictor blocks (I-JEPA: 12 for ViT-H, 6 in its smaller configs).
        num_heads: attention heads per block.
        mlp_ratio: MLP hidden width over ``predictor_dim``.
        qkv_bias: biases in the query/key/value projections (I-JEPA: True).
        drop_path_rate: stochastic depth, rising linearly to this over the blocks.
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        in_dim: int,
        predictor_dim: int = IJEPAPredictorParams.predictor_dim,
        depth: int = IJEPAPredictorParams.depth,
        num_heads: int = IJEPAPredictorParams.num_heads,
        mlp_ratio: float = IJEPAPredictorParams.mlp_ratio,
        qkv_bias: bool = IJEPAPredictorParams.qkv_bias,
        drop_path_rate: float = IJEPAPredictorParams.drop_path_rate,
    ) -> None:
        super().__init__()
        del model_config
        p = parse_head(
            IJEPAPredictorParams,
            "ijepa_predictor",
            {
                "in_dim": in_dim,
                "predictor_dim": predictor_dim,
                "depth": depth,
                "num_heads": num_heads,
                "mlp_ratio": mlp_ratio,
                "qkv_bias": qkv_bias,
                "drop_path_rate": drop_path_rate,
            },
        )
        in_dim, self.predictor_dim, depth, heads = p.in_dim, p.predictor_dim, p.depth, p.num_heads
        mlp_ratio, qkv_bias, drop_path_rate = p.mlp_ratio, p.qkv_bias, p.drop_path_rate
        self.predictor_embed = nn.Linear(in_dim, predictor_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, predictor_dim))
        rates = torch.linspace(0, float(drop_path_rate), depth).tolist()
        self.predictor_blocks = nn.ModuleList(
            Block(
                predictor_dim,
                heads,
                int(predictor_dim * mlp_ratio),
                qkv_bias=bool(qkv_bias),
                drop_path=rate,
            )
            for rate in rates
        )
        self.predictor_norm = nn.LayerNorm(predictor_dim, eps=LAYER_NORM_EPS)
        self.predictor_proj = nn.Linear(predictor_dim, in_dim)
        self._pos_cache: dict[tuple[int, int, torch.device], torch.Tensor] = {}
        self._init_weights()

    def _init_weights(self) -> None:
        """I-JEPA's: truncated normal (std 0.02) Linear weights and mask token, zero biases,
        unit LayerNorms; block ``i``'s ``attn.proj`` and ``mlp.fc2`` weights divided by
        ``sqrt(2 * (i + 1))``."""
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        with torch.no_grad():
            for i, block in enumerate(self.predictor_blocks):
                assert isinstance(block, Block)
                block.attn.proj.weight.div_(math.sqrt(2.0 * (i + 1)))
                block.mlp.fc2.weight.div_(math.sqrt(2.0 * (i + 1)))

    def position_embedding(self, grid: tuple[int, int], device: torch.device) -> torch.Tensor:
        """The fixed sin-cos embedding of a ``grid`` of patches, ``(h * w, predictor_dim)``."""
        key = (grid[0], grid[1], device)
        pos = self._pos_cache.get(key)
        if pos is None:
            pos = sincos_2d_position_embedding(grid[0], grid[1], self.predictor_dim).to(device)
            self._pos_cache[key] = pos
        return pos

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, target_masks: torch.Tensor
    ) -> torch.Tensor:
        """Predict the target blocks' representations.

        Args:
            x: the context encoder's patch tokens, ``(N, K_c, in_dim)``.
            mask: ``(N, h, w)``, True = not in the context (each row keeps ``K_c``).
            target_masks: ``(N, M, h, w)``, True = in target block m (``K_t`` each).

        Returns:
            ``(M * N, K_t, in_dim)``, block-major.

        Raises:
            ValueError: shapes that do not agree.
        """
        n, num_context = x.shape[0], x.shape[1]
        if mask.ndim != 3 or target_masks.ndim != 4 or target_masks.shape[2:] != mask.shape[1:]:
            raise ValueError(
                f"ijepa_predictor takes the context mask (N, h, w) and the target masks "
                f"(N, M, h, w); got {tuple(mask.shape)} and {tuple(target_masks.shape)}."
            )
        grid = (int(mask.shape[1]), int(mask.shape[2]))
        length = grid[0] * grid[1]
        num_blocks = int(target_masks.shape[1])
        context = ~mask.reshape(n, length).to(device=x.device, dtype=torch.bool)
        if equal_row_count(context, "contexts") != num_context:
            raise ValueError(
                f"ijepa_predictor got {num_context} context tokens but the mask keeps "
                f"{int(context[0].sum())} patches per image: give it the encoder's lastPATCH "
                "feature on the context and the mask the encoder used."
            )
        # block-major: row m * N + n is block m of image n
        blocks = target_masks.to(device=x.device, dtype=torch.bool).transpose(0, 1)
        blocks = blocks.reshape(num_blocks * n, length)
        num_target = equal_row_count(blocks, "target blocks")
        pos = self.position_embedding(grid, x.device).unsqueeze(0)
        y = self.predictor_embed(x)
        context_pos = gather_tokens(pos.expand(n, -1, -1), keep_indices(~context, num_context))
        y = y + context_pos.to(y.dtype)
        target_pos = gather_tokens(
            pos.expand(num_blocks * n, -1, -1), keep_indices(~blocks, num_target)
        )
        queries = self.mask_token.to(y.dtype) + target_pos.to(y.dtype)
        tokens = torch.cat((y.repeat(num_blocks, 1, 1), queries), dim=1)
        for block in self.predictor_blocks:
            tokens = block(tokens)
        tokens = self.predictor_norm(tokens)
        return self.predictor_proj(tokens[:, num_context:])

    def extra_repr(self) -> str:
        return f"predictor_dim={self.predictor_dim}, depth={len(self.predictor_blocks)}"

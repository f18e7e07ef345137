"""Trunk ``convit``: VISSL's ConViT (d'Ascoli et al. 2021), a vision transformer whose
first blocks use gated positional self-attention (GPSA).

A GPSA head mixes content attention ``softmax(q k^T * scale)`` with positional attention
``softmax(pos_proj(r_ij) / LOCALITY_DIM)`` over the relative offsets
``r_ij = (dx, dy, dx^2 + dy^2)`` between patches (each repeated LOCALITY_DIM times), by a
learned gate ``sigmoid(alpha_h)``: ``(1 - g) * content + g * positional``, renormalised.
With the local init each head's positional attention peaks at one offset of a
sqrt(heads) x sqrt(heads) neighbourhood, so the GPSA blocks start as a convolution. The
class token joins after the GPSA blocks; the last blocks are plain self-attention.

Configured like VISSL: the transformer sizes come from MODEL.TRUNK.VISION_TRANSFORMERS
(IMAGE_SIZE, PATCH_SIZE, HIDDEN_DIM, NUM_LAYERS, NUM_HEADS, MLP_DIM, DROPOUT_RATE,
ATTENTION_DROPOUT_RATE, DROP_PATH_RATE, QKV_BIAS, QK_SCALE, CLASSIFIER and the ``name``
presets; see docs/models/vision_transformer.md), the ConViT ones from MODEL.TRUNK.CONVIT:

- ``N_GPSA_LAYERS`` (10): the first blocks that use GPSA (at most NUM_LAYERS);
- ``LOCALITY_STRENGTH`` (1.0): alpha of the paper, the sharpness of the initial
  positional attention; <= 0: 1 / (block index + 1);
- ``LOCALITY_DIM`` (10): how many times each relative-position feature is repeated
  (pos_proj has 3 * LOCALITY_DIM inputs);
- ``USE_LOCAL_INIT`` (True): the local (convolutional) init of the GPSA blocks;
- ``CLASS_TOKEN_IN_LOCAL_LAYERS`` (False): must stay False. VISSL cannot run True either
  (its relative positions are built for the patches only);
- ``QKV_BIAS``, ``QK_SCALE``: accepted for VISSL's configs, which set them here; as in
  VISSL, VISION_TRANSFORMERS.QKV_BIAS / QK_SCALE are the ones used (a warning says so
  when the two differ).

Differences from VISSL: the local init is applied after the general init (VISSL's
general init overwrote it, so USE_LOCAL_INIT had no effect there), inputs of another
size than IMAGE_SIZE get bicubically interpolated position embeddings and relative
positions of their own (non-square inputs too), and LayerNorms are PyTorch's (eps 1e-5)
as in VISSL.

State-dict names are VISSL's, so VISSL's ConViT checkpoints load: ``patch_embed.proj``,
``class_token``, ``pos_embedding``, ``blocks.<i>.{norm1, norm2, mlp.linear_1,
mlp.linear_2}``, GPSA blocks ``blocks.<i>.attn.{qk, v, proj, pos_proj, alpha}``,
self-attention blocks ``blocks.<i>.attn.{qkv, proj}``, and ``norm``.

Features (``out_feat_keys``; tokens go through the final LayerNorm ``norm``):

===========  ==================================================  ====================
name         what                                                shape
===========  ==================================================  ====================
lastCLS      the class token (CLASSIFIER token: the default)     N x HIDDEN_DIM
lastPOOL     the mean of all tokens, class token included, as   N x HIDDEN_DIM
             VISSL's ConViT (CLASSIFIER gap: the default)
lastMAP      the last block's patch tokens as a map             N x HIDDEN_DIM x h x w
blkMAP{i}    the patch tokens after block i, as a map           N x HIDDEN_DIM x h x w
===========  ==================================================  ====================
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.ops import StochasticDepth

from vissl.config.params import IntAtLeast
from vissl.models.model_helpers import cfg_get, input_channels, transform_model_input_data_type
from vissl.models.trunks import register_model_trunk
from vissl.models.trunks._trunk_params import (
    PosInt,
    checkpointing_on,
    maybe_checkpoint,
    parse_trunk,
    resolve_features,
    tokens_to_map,
    trunk_error,
)
from vissl.models.trunks.vision_transformer import parse_vit_config

logger = logging.getLogger(__name__)


@dataclass(kw_only=True, frozen=True)
class ConViTParams:
    """``config.MODEL.TRUNK.CONVIT`` (VISSL's keys and defaults, plus QKV_BIAS and
    QK_SCALE, which VISSL's ConViT configs carry in this block: as in VISSL, ConViT
    takes them from VISION_TRANSFORMERS, and a differing value here is only logged).

    N_GPSA_LAYERS is at most VISION_TRANSFORMERS.NUM_LAYERS (checked by the trunk);
    CLASS_TOKEN_IN_LOCAL_LAYERS must be False.
    """

    N_GPSA_LAYERS: Annotated[int, IntAtLeast(0)] = 10
    CLASS_TOKEN_IN_LOCAL_LAYERS: bool = False
    LOCALITY_STRENGTH: float = 1.0
    LOCALITY_DIM: PosInt = 10
    USE_LOCAL_INIT: bool = True
    QKV_BIAS: bool = False
    QK_SCALE: bool | float | None = False

    def check(self, key_path: str) -> None:
        if self.CLASS_TOKEN_IN_LOCAL_LAYERS:
            raise trunk_error(
                "CONVIT",
                "CLASS_TOKEN_IN_LOCAL_LAYERS",
                True,
                "is not supported (VISSL's ConViT cannot run it either: its relative "
                "positions cover the patches only); set it to False.",
            )


#: The block's defaults (a differing QKV_BIAS / QK_SCALE is logged, not the default).
_DEFAULTS = ConViTParams()


def _init_linear_and_norm(module: nn.Module) -> None:
    """Truncated normal (std 0.02) Linear weights, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class Mlp(nn.Module):
    """linear_1 -> GELU -> dropout -> linear_2 -> dropout (VISSL's names)."""

    def __init__(self, dim: int, hidden_dim: int, drop: float) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.dropout_1 = nn.Dropout(drop)
        self.linear_2 = nn.Linear(hidden_dim, dim)
        self.dropout_2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout_2(self.linear_2(self.dropout_1(self.act(self.linear_1(x)))))


def relative_positions(grid: tuple[int, int], locality_dim: int) -> torch.Tensor:
    """(1, h*w, h*w, 3 * locality_dim): for patches i, j of an h x w grid (row-major), the
    x offset, the y offset and the squared distance from i to j, each repeated
    ``locality_dim`` times."""
    h, w = grid
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    xs, ys = xs.flatten(), ys.flatten()
    dx = (xs[None, :] - xs[:, None]).float()
    dy = (ys[None, :] - ys[:, None]).float()
    feats = [dx, dy, dx * dx + dy * dy]
    return torch.stack(feats, dim=-1).repeat_interleave(locality_dim, dim=-1).unsqueeze(0)


class GPSA(nn.Module):
    """Gated positional self-attention (VISSL's parameter names).

    Args:
        dim: token width.
        num_heads: heads (a square number for a complete local init).
        qkv_bias: biases in the q/k and v projections.
        qk_scale: the content logits' scale; None: 1/sqrt(dim / num_heads).
        attn_drop, proj_drop: dropout on the attention weights / after the projection.
        locality_strength: the local init's sharpness.
        locality_dim: repeats of each relative-position feature.
        use_local_init: start as a convolution (see :meth:`local_init`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool,
        qk_scale: float | None,
        attn_drop: float,
        proj_drop: float,
        locality_strength: float,
        locality_dim: int,
        use_local_init: bool,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = qk_scale if qk_scale is not None else (dim // num_heads) ** -0.5
        self.locality_strength = locality_strength
        self.locality_dim = locality_dim
        self.use_local_init = use_local_init
        self.qk = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.pos_proj = nn.Linear(3 * locality_dim, num_heads)
        self.proj_drop = nn.Dropout(proj_drop)
        self.alpha = nn.Parameter(torch.ones(1, num_heads, 1, 1))
        self._positions: dict[tuple[int, int, str], torch.Tensor] = {}

    @torch.no_grad()
    def local_init(self) -> None:
        """v = identity; head (a, b) of the sqrt(heads) x sqrt(heads) kernel attends
        around the offset (a - c, b - c) from the centre c: its pos_proj weights are
        2 (a - c) on the x offsets, 2 (b - c) on the y offsets and -1 on the squared
        distances, times LOCALITY_STRENGTH."""
        self.v.weight.copy_(torch.eye(self.v.weight.shape[0]))
        kernel = int(self.num_heads**0.5)
        center = (kernel - 1) / 2 if kernel % 2 == 0 else kernel // 2
        ld = self.locality_dim
        weight = self.pos_proj.weight
        for h1 in range(kernel):
            for h2 in range(kernel):
                head = h1 + kernel * h2
                weight[head, :ld] = 2 * (h2 - center)
                weight[head, ld : 2 * ld] = 2 * (h1 - center)
                weight[head, 2 * ld : 3 * ld] = -1
        weight.mul_(self.locality_strength)

    def _relative_positions(self, grid: tuple[int, int], ref: torch.Tensor) -> torch.Tensor:
        key = (grid[0], grid[1], str(ref.device))
        cached = self._positions.get(key)
        if cached is None:
            cached = relative_positions(grid, self.locality_dim).to(ref.device)
            self._positions[key] = cached
        return cached.to(ref.dtype)

    def attention(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """The gated attention weights (N, heads, L, L) of tokens ``x`` on ``grid``."""
        n, length, dim = x.shape
        head_dim = dim // self.num_heads
        qk = self.qk(x).reshape(n, length, 2, self.num_heads, head_dim).permute(2, 0, 3, 1, 4)
        q, k = qk.unbind(0)
        positional = self.pos_proj(self._relative_positions(grid, x)).permute(0, 3, 1, 2)
        positional = (positional / self.locality_dim).softmax(dim=-1)
        content = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        gate = torch.sigmoid(self.alpha)
        attn = (1.0 - gate) * content + gate * positional
        return attn / attn.sum(dim=-1, keepdim=True)

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        n, length, dim = x.shape
        attn = self.attn_drop(self.attention(x, grid))
        v = self.v(x).reshape(n, length, self.num_heads, dim // self.num_heads).transpose(1, 2)
        out = (attn @ v).transpose(1, 2).reshape(n, length, dim)
        return self.proj_drop(self.proj(out))


class SelfAttention(nn.Module):
    """Multi-head self-attention (VISSL's names: ``qkv``, ``proj``)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool,
        qk_scale: float | None,
        attn_drop: float,
        proj_drop: float,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = qk_scale if qk_scale is not None else (dim // num_heads) ** -0.5
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        n, length, dim = x.shape
        qkv = self.qkv(x).reshape(n, length, 3, self.num_heads, dim // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop if self.training else 0.0, scale=self.scale
        )
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(n, length, dim)))


class AttentionBlock(nn.Module):
    """Pre-norm block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``, both
    residual branches through per-sample stochastic depth."""

    def __init__(
        self, attn: GPSA | SelfAttention, dim: int, mlp_dim: int, drop: float, drop_path: float
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attn
        self.drop_path = StochasticDepth(drop_path, "row") if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_dim, drop)

    def forward(self, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), grid))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    """``patch_size`` squares projected to ``dim`` (``proj``, VISSL's name)."""

    def __init__(self, patch_size: int, in_chans: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


@register_model_trunk("convit")
class ConViT(nn.Module):
    """ConViT: GPSA blocks, then self-attention blocks.

    Args:
        model_config: config.MODEL; reads TRUNK.VISION_TRANSFORMERS, TRUNK.CONVIT,
            INPUT_TYPE and ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING (every
            block; so does VISION_TRANSFORMERS.CHECKPOINT_BLOCK).
        model_name: the registry name (unused).

    Raises:
        ConfigError: a bad VISION_TRANSFORMERS or CONVIT value, naming its key.
    """

    #: Excluded from weight decay besides norms and biases (relative names).
    NO_WEIGHT_DECAY: ClassVar[frozenset[str]] = frozenset({"pos_embedding", "class_token"})

    def __init__(self, model_config: Mapping[str, Any], model_name: str = "convit") -> None:
        super().__init__()
        self.model_config = model_config
        vit_block = cfg_get(model_config, "TRUNK.VISION_TRANSFORMERS")
        s = parse_vit_config(vit_block)
        p = parse_trunk(ConViTParams, model_config, "CONVIT")
        n_gpsa = p.N_GPSA_LAYERS
        if n_gpsa > s.num_layers:
            raise trunk_error(
                "CONVIT",
                "N_GPSA_LAYERS",
                n_gpsa,
                f"must be at most config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_LAYERS="
                f"{s.num_layers}.",
            )
        locality_strength, locality_dim = p.LOCALITY_STRENGTH, p.LOCALITY_DIM
        use_local_init = p.USE_LOCAL_INIT
        used = {"QKV_BIAS": s.qkv_bias, "QK_SCALE": s.qk_scale}
        given = {"QKV_BIAS": p.QKV_BIAS, "QK_SCALE": p.QK_SCALE or None}
        for key, value in given.items():
            if value != used[key] and getattr(p, key) != getattr(_DEFAULTS, key):
                logger.warning(
                    "config.MODEL.TRUNK.CONVIT.%s=%r is not used: as in VISSL, ConViT takes "
                    "config.MODEL.TRUNK.VISION_TRANSFORMERS.%s (%r).",
                    key,
                    getattr(p, key),
                    key,
                    used[key],
                )
        self.input_type = str(cfg_get(model_config, "INPUT_TYPE", "rgb"))
        self.settings = s
        self.patch_size = s.patch_size
        self.grid_size = s.image_size // s.patch_size
        self.n_gpsa_layers = n_gpsa
        self.classifier = s.classifier
        self.embed_dim = self.num_features = self.output_dim = s.hidden_dim
        self.patch_embed = PatchEmbed(s.patch_size, input_channels(self.input_type), s.hidden_dim)
        self.class_token = nn.Parameter(torch.zeros(1, 1, s.hidden_dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, self.grid_size**2, s.hidden_dim))
        self.pos_drop = nn.Dropout(s.dropout_rate)
        rates = torch.linspace(0, s.drop_path_rate, s.num_layers, device="cpu").tolist()
        blocks: list[nn.Module] = []
        for i, rate in enumerate(rates):
            attn: GPSA | SelfAttention
            if i < n_gpsa:
                attn = GPSA(
                    s.hidden_dim,
                    s.num_heads,
                    s.qkv_bias,
                    s.qk_scale,
                    s.attention_dropout_rate,
                    s.dropout_rate,
                    locality_strength if locality_strength > 0 else 1.0 / (i + 1),
                    locality_dim,
                    use_local_init,
                )
            else:
                attn = SelfAttention(
                    s.hidden_dim,
                    s.num_heads,
                    s.qkv_bias,
                    s.qk_scale,
                    s.attention_dropout_rate,
                    s.dropout_rate,
                )
            blocks.append(AttentionBlock(attn, s.hidden_dim, s.mlp_dim, s.dropout_rate, rate))
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(s.hidden_dim)
        nn.init.trunc_normal_(self.pos_embedding, std=0.02)
        nn.init.trunc_normal_(self.class_token, std=0.02)
        self.apply(_init_linear_and_norm)
        for module in self.modules():
            if isinstance(module, GPSA) and module.use_local_init:
                module.local_init()
        self.use_checkpointing = s.checkpoint_block or checkpointing_on(model_config)
        self.default_feature = "lastCLS" if s.classifier == "token" else "lastPOOL"
        self.feature_names = [
            "lastCLS",
            "lastPOOL",
            "lastMAP",
            *(f"blkMAP{i}" for i in range(s.num_layers)),
        ]
        logger.info(
            "Building ConViT: %d px, patch %d, width %d, %d blocks (%d GPSA), %d heads",
            s.image_size,
            s.patch_size,
            s.hidden_dim,
            s.num_layers,
            n_gpsa,
            s.num_heads,
        )

    def no_weight_decay(self) -> set[str]:
        """The embeddings, to exclude from weight decay (as timm's ``no_weight_decay``)."""
        return set(self.NO_WEIGHT_DECAY)

    def _position_embedding(self, grid: tuple[int, int]) -> torch.Tensor:
        if grid == (self.grid_size, self.grid_size):
            return self.pos_embedding
        dim = self.pos_embedding.shape[-1]
        square = self.pos_embedding.reshape(1, self.grid_size, self.grid_size, dim)
        resized = F.interpolate(
            square.permute(0, 3, 1, 2).float(), size=grid, mode="bicubic", align_corners=False
        )
        return resized.permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], dim).to(square.dtype)

    def forward(
        self, x: torch.Tensor, out_feat_keys: list[str] | None = None
    ) -> list[torch.Tensor]:
        """The features named in ``out_feat_keys`` (default: ``lastCLS`` for CLASSIFIER
        token, ``lastPOOL`` for gap).

        Raises:
            ConfigError: an unknown feature name.
            ValueError: image sides that are not multiples of PATCH_SIZE.
        """
        names = resolve_features(out_feat_keys, self.feature_names, self.default_feature, "convit")
        height, width = x.shape[-2:]
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(
                f"convit got {height}x{width} px images; both sides must be multiples of "
                f"config.MODEL.TRUNK.VISION_TRANSFORMERS.PATCH_SIZE={self.patch_size}."
            )
        maps = {int(n[len("blkMAP") :]) for n in names if n.startswith("blkMAP")}
        needs_last = any(n.startswith("last") for n in names)
        last = len(self.blocks) - 1 if needs_last else max(maps)
        feat = self.patch_embed(transform_model_input_data_type(x, self.input_type))
        grid = (feat.shape[-2], feat.shape[-1])
        tokens = feat.flatten(2).transpose(1, 2)
        tokens = self.pos_drop(tokens + self._position_embedding(grid))
        out: dict[str, torch.Tensor] = {}
        with_class = False
        for i, block in enumerate(self.blocks[: last + 1]):
            if i == self.n_gpsa_layers:
                cls = self.class_token.expand(tokens.shape[0], -1, -1)
                tokens = torch.cat((cls, tokens), dim=1)
                with_class = True
            tokens = maybe_checkpoint(block, self.use_checkpointing, self, tokens, grid)
            if i in maps:
                patches = tokens[:, 1:] if with_class else tokens
                out[f"blkMAP{i}"] = tokens_to_map(self.norm(patches), grid)
        if needs_last:
            if not with_class:  # every block is GPSA: the class token joins at the end
                cls = self.class_token.expand(tokens.shape[0], -1, -1)
                tokens = torch.cat((cls, tokens), dim=1)
            normed = self.norm(tokens)
            out["lastCLS"] = normed[:, 0]
            out["lastPOOL"] = normed.mean(dim=1)
            out["lastMAP"] = tokens_to_map(normed[:, 1:], grid)
        return [out[n] for n in names]


__all__ = ["GPSA", "ConViT", "relative_positions"]

"""Vision Transformer trunk ``vision_transformer`` (ViT / DeiT, as DINO and VISSL build it).

Configured by MODEL.TRUNK.VISION_TRANSFORMERS (docs/models/vision_transformer.md): a
``name`` preset (tiny | small | base) or HIDDEN_DIM, NUM_LAYERS, NUM_HEADS and MLP_DIM;
IMAGE_SIZE and PATCH_SIZE; DROPOUT_RATE, ATTENTION_DROPOUT_RATE, DROP_PATH_RATE; QKV_BIAS,
QK_SCALE; CLASSIFIER (token | gap); CHECKPOINT_MLP / CHECKPOINT_BLOCK; FREEZE_PATCH_EMBED;
USE_CLASS_TOKEN, NUM_REGISTER_TOKENS, INIT_VALUES (layer scale), POS_EMBED (learned |
sincos), INIT (default | mae | ijepa | moco_v3) and MASKED_IMAGE_MODELING (what a patch
mask given to ``forward`` does).

POS_EMBED sincos (MAE, I-JEPA, MoCo v3): ``pos_embed`` holds the fixed 2-D sin-cos
embedding and is never trained (``requires_grad`` False, like FREEZE_PATCH_EMBED's
projection: in no optimizer group, saved and loaded under the same key). INIT picks the
authors' initialisation of the weights (``INITS``); ``default`` is DINO's.

FREEZE_PATCH_EMBED (MoCo v3's "random patch projection", Chen, Xie, He 2021, section 4.2):
the patch projection ``patch_embed.proj`` keeps its random init and is never trained
(``requires_grad`` False), a stabiliser of ViT self-supervised training. Frozen
parameters are in no optimizer group (so no weight decay, no LARS trust ratio), DDP
reduces no gradient for them (no ``find_unused_parameters`` needed) but still broadcasts
rank 0's values at the start, and they are saved, loaded (``MODEL.WEIGHTS_INIT``,
resume) and copied into momentum encoders like any other parameter.

Pre-norm blocks (LayerNorm eps 1e-6), attention through
``torch.nn.functional.scaled_dot_product_attention``, GELU MLP, a class token and a learned
position embedding (truncated-normal init, std 0.02) by default. Inputs of another size
than IMAGE_SIZE (multi-crop) get bicubically interpolated position embeddings (sincos: the
sin-cos at the positions that interpolation samples, computed exactly). Parameter names
are DINO's and VISSL's (``patch_embed.proj``, ``cls_token``, ``pos_embed``,
``blocks.{i}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}``, ``norm``), so their ViT
checkpoints load unchanged. The options add parameters only when they are on:
``register_tokens`` (DINOv2's name), ``blocks.{i}.ls1.gamma`` / ``ls2.gamma`` (layer scale,
DINOv2's and timm's names), ``patch_masking.masked_embed`` (iBOT's mask token, VISSL's
name); ``USE_CLASS_TOKEN: False`` removes ``cls_token``.

The token sequence is ``[class token] [register tokens] [patch tokens]``; the class token
and the patches carry position embeddings, the registers do not (Darcet et al. 2024).

Patch masks (``forward(x, out_feat_keys, mask=...)``, a boolean ``(N, h, w)`` or
``(N, h*w)`` tensor, True = masked; see :mod:`vissl.models.token_masking`), by
MASKED_IMAGE_MODELING.NAME:

- ``mae``: the masked patches are dropped after the position embedding; the blocks see only
  the visible ones (every row must keep the same number). Patch features (POOL, PATCH, BLK)
  are those of the visible patches, in patch order; MAP is not available.
- ``ibot``: each masked patch's embedding is replaced by the learned ``masked_embed`` before
  the position embedding is added (iBOT, BEiT); the sequence keeps every patch.
- ``msn`` (VISSL's MSN drop masking): a given mask is dropped as with ``mae``; without one,
  in training mode, the trunk drops ``PARAMS.drop_ratio`` of the patches itself, after the
  position embedding: one random set per forward (per group of same-size crops), the same
  for every image, ``floor(L (1 - drop_ratio))`` of the ``L`` patches kept (in patch order),
  the class token always. Inputs of fewer than ``PARAMS.global_view_tokens`` patches (VISSL:
  196, so MSN's 96 px focal crops) are left whole, as in MSN's code (``src/deit.py`` drops
  patches of its first, 224 px, group of crops only); 0 drops patches of every input, the
  focal views' too (an ablation). The draw comes from torch's global
  generator (as drop path's), whose state the checkpoints hold, so a resume draws the same
  sets. In eval mode (evaluation, EMA target encoders) nothing is dropped.

Features, by VISSL's names (``out_feat_keys``; i counts blocks from 0, n the last blocks;
every block output goes through the final LayerNorm ``norm`` first, as in DINO):

==============  ==============================================  ======================
name            what                                            shape
==============  ==============================================  ======================
lastCLS         class token of the last block (CLASSIFIER token) N x D
lastPOOL        mean of the last block's patch tokens (gap)      N x D
lastMAP         the last block's patch tokens as a map           N x D x h x w
lastBLK         class token and patch tokens of the last block   N x (1 + h*w) x D
lastPATCH       the last block's patch tokens (no class token)   N x h*w x D
blkCLS{i}       ... of block i (also blkPOOL/MAP/BLK/PATCH{i})  as above
concatCLS{n}    the last n blocks' class tokens, concatenated    N x nD
concatPOOL{n}   (also concatMAP/BLK/PATCH{n})                    along the feature dim
==============  ==============================================  ======================

Register tokens are in no feature (BLK is the class token and the patches, so index 0 is
the class token and 1: the patches, as consumers of VISSL's ``lastBLK`` expect). Without a
class token, BLK equals PATCH and CLS features are an error.

The default output (no ``out_feat_keys``) is ``lastCLS`` for CLASSIFIER token and
``lastPOOL`` for CLASSIFIER gap. ``lastMAP`` is channels-first (VISSL returned
N x h x w x D) so that the 2D pool ops of LINEAR_EVAL_FEAT_POOL_OPS_MAP apply to it.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torchvision.ops import StochasticDepth

from vissl.errors import ConfigError
from vissl.models.model_helpers import cfg_get, input_channels, transform_model_input_data_type
from vissl.models.token_masking import (
    flatten_mask,
    gather_tokens,
    keep_indices,
    sincos_2d_embedding,
    visible_count,
)
from vissl.models.trunks import register_model_trunk

logger = logging.getLogger(__name__)

_KEY = "config.MODEL.TRUNK.VISION_TRANSFORMERS"
_FEATURES_KEY = "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP"

#: ``name`` -> (HIDDEN_DIM, NUM_LAYERS, NUM_HEADS, MLP_DIM), as DeiT / DINO define them.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"HIDDEN_DIM": 192, "NUM_LAYERS": 12, "NUM_HEADS": 3, "MLP_DIM": 768},
    "small": {"HIDDEN_DIM": 384, "NUM_LAYERS": 12, "NUM_HEADS": 6, "MLP_DIM": 1536},
    "base": {"HIDDEN_DIM": 768, "NUM_LAYERS": 12, "NUM_HEADS": 12, "MLP_DIM": 3072},
}

#: The values of vissl/config/defaults.yaml, used for keys a partial config leaves out.
DEFAULTS: dict[str, Any] = {
    "name": None,
    "IMAGE_SIZE": 224,
    "PATCH_SIZE": 16,
    "HIDDEN_DIM": 768,
    "NUM_LAYERS": 12,
    "NUM_HEADS": 12,
    "MLP_DIM": 3072,
    "DROPOUT_RATE": 0.0,
    "ATTENTION_DROPOUT_RATE": 0.0,
    "DROP_PATH_RATE": 0.0,
    "QKV_BIAS": False,
    "QK_SCALE": False,
    "CLASSIFIER": "token",
    "CHECKPOINT_MLP": False,
    "CHECKPOINT_BLOCK": False,
    "FREEZE_PATCH_EMBED": False,
    "USE_CLASS_TOKEN": True,
    "NUM_REGISTER_TOKENS": 0,
    "INIT_VALUES": False,
    "POS_EMBED": "learned",
    "INIT": "default",
    "MASKED_IMAGE_MODELING": {"NAME": "", "PARAMS": {}},
}

CLASSIFIERS = ("token", "gap")
#: POS_EMBED -> the position embedding ``pos_embed``
POS_EMBEDS = {
    "learned": "learned, truncated-normal init (std 0.02): DINO's, iBOT's, DINOv2's, MSN's",
    "sincos": "the fixed 2-D sin-cos embedding (requires_grad False; the class token's entry "
    "is 0): MAE's, I-JEPA's, MoCo v3's",
}
#: INIT -> the initialisation of the trunk's weights
INITS = {
    "default": "DINO's (timm's DeiT): truncated normal std 0.02 on the Linear weights and the "
    "class token, zero biases, PyTorch's default on the patch projection",
    "mae": "MAE's initialize_weights: xavier-uniform on every Linear and on the flattened "
    "patch projection, zero Linear biases, class token normal std 0.02",
    "ijepa": "I-JEPA's: truncated normal std 0.02 on the Linear weights and the patch "
    "projection, zero biases, then each block i's attn.proj and mlp.fc2 weights divided by "
    "sqrt(2 (i + 1))",
    "moco_v3": "MoCo v3's: xavier-uniform on the Linears (q, k and v each as its own matrix) "
    "and on the flattened patch projection, zero biases, class token normal std 1e-6",
}
#: MASKED_IMAGE_MODELING.NAME -> what a patch mask given to ``forward`` does
MASKING_MODES = {
    "": "no masking (a mask given to forward is an error)",
    "mae": "drop the masked patches: the blocks see the visible ones only (MAE)",
    "ibot": "replace the masked patches' embeddings by a learned mask token (iBOT, BEiT)",
    "msn": "as mae for a given mask; without one, drop PARAMS.drop_ratio of the patches at "
    "random in training (VISSL's MSN drop masking)",
}
#: VISSL's MASKED_IMAGE_MODELING.PARAMS of ``msn`` and their defaults
MSN_PARAMS: dict[str, Any] = {"drop_ratio": 0.0, "global_view_tokens": 196}
LAYER_NORM_EPS = 1e-6


# --------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class ViTSettings:
    """Validated VISION_TRANSFORMERS values (preset applied)."""

    image_size: int
    patch_size: int
    hidden_dim: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    dropout_rate: float
    attention_dropout_rate: float
    drop_path_rate: float
    qkv_bias: bool
    qk_scale: float | None
    classifier: str
    checkpoint_mlp: bool
    checkpoint_block: bool
    freeze_patch_embed: bool = False
    use_class_token: bool = True
    num_register_tokens: int = 0
    #: layer scale: the initial value of the per-channel residual scales; None: off
    init_values: float | None = None
    #: MASKED_IMAGE_MODELING.NAME: "", "mae", "ibot" or "msn"
    masking: str = ""
    #: msn: the fraction of the patches dropped in training when no mask is given
    drop_ratio: float = 0.0
    #: msn: inputs of fewer patches are not dropped (VISSL's focal views)
    global_view_tokens: int = 196
    #: POS_EMBED: "learned" or "sincos"
    pos_embed: str = "learned"
    #: INIT: a key of INITS
    init: str = "default"


def _positive_int(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg.get(key, DEFAULTS[key])
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"{_KEY}.{key} must be a positive integer; got {value!r}. "
            f"The default is {DEFAULTS[key]}.",
            f"{_KEY}.{key}",
        )
    return value


def _rate(cfg: Mapping[str, Any], key: str) -> float:
    value = cfg.get(key, DEFAULTS[key])
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ConfigError(
            f"{_KEY}.{key} must be a number in [0, 1) (a probability; 0 turns it off); "
            f"got {value!r}.",
            f"{_KEY}.{key}",
        )
    return float(value)


def _flag(cfg: Mapping[str, Any], key: str) -> bool:
    value = cfg.get(key, DEFAULTS[key])
    if not isinstance(value, bool):
        raise ConfigError(f"{_KEY}.{key} must be True or False; got {value!r}.", f"{_KEY}.{key}")
    return value


def parse_vit_config(trunk_config: Mapping[str, Any] | None) -> ViTSettings:
    """Validate MODEL.TRUNK.VISION_TRANSFORMERS and apply the ``name`` preset.

    With a preset, HIDDEN_DIM, NUM_LAYERS, NUM_HEADS and MLP_DIM take the preset's values;
    a config value for one of them must then be the default (the base values) or the
    preset's own.

    Raises:
        ConfigError: a bad value, naming its full key path and how to fix it.
    """
    cfg: Mapping[str, Any] = trunk_config or {}
    sizes = {
        key: _positive_int(cfg, key)
        for key in ("IMAGE_SIZE", "PATCH_SIZE", "HIDDEN_DIM", "NUM_LAYERS", "NUM_HEADS", "MLP_DIM")
    }
    name = cfg.get("name", None)
    if name is not None:
        if not isinstance(name, str) or name not in PRESETS:
            raise ConfigError(
                f"{_KEY}.name={name!r} is not a preset; use one of {list(PRESETS)} "
                "(HIDDEN_DIM, NUM_LAYERS, NUM_HEADS, MLP_DIM = "
                + ", ".join(f"{n}: {tuple(p.values())}" for n, p in PRESETS.items())
                + "), or null to set those four keys yourself.",
                f"{_KEY}.name",
            )
        for key, preset_value in PRESETS[name].items():
            if sizes[key] not in (DEFAULTS[key], preset_value):
                raise ConfigError(
                    f"{_KEY}.{key}={sizes[key]} conflicts with {_KEY}.name={name!r}, whose "
                    f"{key} is {preset_value}. Remove {key} from the config (or set it to "
                    f"{preset_value}), or set name: null to use your own {key}.",
                    f"{_KEY}.{key}",
                )
            sizes[key] = preset_value
    if sizes["HIDDEN_DIM"] % sizes["NUM_HEADS"] != 0:
        raise ConfigError(
            f"{_KEY}.HIDDEN_DIM={sizes['HIDDEN_DIM']} is not divisible by "
            f"{_KEY}.NUM_HEADS={sizes['NUM_HEADS']}; every head gets HIDDEN_DIM / NUM_HEADS "
            "channels, so pick a NUM_HEADS that divides HIDDEN_DIM (e.g. HIDDEN_DIM / 64).",
            f"{_KEY}.HIDDEN_DIM",
        )
    if sizes["IMAGE_SIZE"] % sizes["PATCH_SIZE"] != 0:
        raise ConfigError(
            f"{_KEY}.IMAGE_SIZE={sizes['IMAGE_SIZE']} is not divisible by "
            f"{_KEY}.PATCH_SIZE={sizes['PATCH_SIZE']}; the image is cut into whole patches, "
            "so make IMAGE_SIZE a multiple of PATCH_SIZE (e.g. 224 and 16, or 32 and 4).",
            f"{_KEY}.IMAGE_SIZE",
        )
    classifier = cfg.get("CLASSIFIER", DEFAULTS["CLASSIFIER"])
    if classifier not in CLASSIFIERS:
        raise ConfigError(
            f"{_KEY}.CLASSIFIER={classifier!r} is not supported; use 'token' (the class "
            "token after the final LayerNorm) or 'gap' (the mean of the patch tokens).",
            f"{_KEY}.CLASSIFIER",
        )
    qk_scale = cfg.get("QK_SCALE", DEFAULTS["QK_SCALE"])
    if qk_scale is False or qk_scale is None:
        scale: float | None = None
    elif isinstance(qk_scale, int | float) and not isinstance(qk_scale, bool) and qk_scale > 0:
        scale = float(qk_scale)
    else:
        raise ConfigError(
            f"{_KEY}.QK_SCALE must be False (scale 1/sqrt(HIDDEN_DIM / NUM_HEADS)) or a "
            f"positive number; got {qk_scale!r}.",
            f"{_KEY}.QK_SCALE",
        )
    use_class_token = _flag(cfg, "USE_CLASS_TOKEN")
    if not use_class_token and classifier == "token":
        raise ConfigError(
            f"{_KEY}.USE_CLASS_TOKEN is False but {_KEY}.CLASSIFIER is 'token' (the class "
            "token's output): set CLASSIFIER: gap (the mean of the patch tokens) for a trunk "
            "without a class token.",
            f"{_KEY}.CLASSIFIER",
        )
    registers = cfg.get("NUM_REGISTER_TOKENS", DEFAULTS["NUM_REGISTER_TOKENS"])
    if isinstance(registers, bool) or not isinstance(registers, int) or registers < 0:
        raise ConfigError(
            f"{_KEY}.NUM_REGISTER_TOKENS must be an integer >= 0 (0: no registers; DINOv2 "
            f"with registers uses 4); got {registers!r}.",
            f"{_KEY}.NUM_REGISTER_TOKENS",
        )
    pos_embed = _choice(cfg, "POS_EMBED", POS_EMBEDS)
    if pos_embed == "sincos" and sizes["HIDDEN_DIM"] % 4:
        raise ConfigError(
            f"{_KEY}.POS_EMBED is 'sincos' but {_KEY}.HIDDEN_DIM={sizes['HIDDEN_DIM']} is not "
            "divisible by 4: the 2-D sin-cos embedding gives a quarter of the channels to each "
            "of sin(row), cos(row), sin(column), cos(column). Use a HIDDEN_DIM divisible by 4 "
            "or POS_EMBED: learned.",
            f"{_KEY}.POS_EMBED",
        )
    return ViTSettings(
        image_size=sizes["IMAGE_SIZE"],
        patch_size=sizes["PATCH_SIZE"],
        hidden_dim=sizes["HIDDEN_DIM"],
        num_layers=sizes["NUM_LAYERS"],
        num_heads=sizes["NUM_HEADS"],
        mlp_dim=sizes["MLP_DIM"],
        dropout_rate=_rate(cfg, "DROPOUT_RATE"),
        attention_dropout_rate=_rate(cfg, "ATTENTION_DROPOUT_RATE"),
        drop_path_rate=_rate(cfg, "DROP_PATH_RATE"),
        qkv_bias=_flag(cfg, "QKV_BIAS"),
        qk_scale=scale,
        classifier=str(classifier),
        checkpoint_mlp=_flag(cfg, "CHECKPOINT_MLP"),
        checkpoint_block=_flag(cfg, "CHECKPOINT_BLOCK"),
        freeze_patch_embed=_flag(cfg, "FREEZE_PATCH_EMBED"),
        use_class_token=use_class_token,
        num_register_tokens=registers,
        init_values=_init_values(cfg),
        pos_embed=pos_embed,
        init=_choice(cfg, "INIT", INITS),
        **_masking(cfg),
    )


def _choice(cfg: Mapping[str, Any], key: str, choices: Mapping[str, str]) -> str:
    value = cfg.get(key, DEFAULTS[key])
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(
            f"{_KEY}.{key}={value!r} is not supported; use one of "
            + "; ".join(f"{name!r}: {what}" for name, what in choices.items())
            + ".",
            f"{_KEY}.{key}",
        )
    return value


def _init_values(cfg: Mapping[str, Any]) -> float | None:
    value = cfg.get("INIT_VALUES", DEFAULTS["INIT_VALUES"])
    if value is False or value is None or (isinstance(value, int | float) and value == 0):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(
            f"{_KEY}.INIT_VALUES (layer scale) must be False (off) or a positive number, the "
            f"initial value of the per-channel scales of each residual branch (DINOv2: "
            f"1e-5, CaiT: 1e-5 to 0.1); got {value!r}.",
            f"{_KEY}.INIT_VALUES",
        )
    return float(value)


def _masking(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ViTSettings' ``masking`` (and msn's ``drop_ratio`` and ``global_view_tokens``)."""
    key = f"{_KEY}.MASKED_IMAGE_MODELING"
    mim = cfg.get("MASKED_IMAGE_MODELING", None) or {}
    if not isinstance(mim, Mapping):
        raise ConfigError(f"{key} must be a mapping {{NAME: ..., PARAMS: {{}}}}; got {mim!r}.", key)
    name = mim.get("NAME", "") or ""
    if name not in MASKING_MODES:
        raise ConfigError(
            f"{key}.NAME={name!r} is not supported; use one of "
            + "; ".join(f"{n!r}: {what}" for n, what in MASKING_MODES.items())
            + ".",
            f"{key}.NAME",
        )
    params = mim.get("PARAMS", None) or {}
    if name == "msn":
        return {"masking": name, **_msn_params(params, f"{key}.PARAMS")}
    if params:
        raise ConfigError(
            f"{key}.PARAMS={dict(params)!r}: NAME {name!r} takes no parameters (the masks "
            "come from the data transforms RandomPatchMasking and MaskedImageModeling); leave "
            "PARAMS empty.",
            f"{key}.PARAMS",
        )
    return {"masking": str(name)}


def _msn_params(params: Mapping[str, Any], key: str) -> dict[str, Any]:
    unknown = sorted(set(params) - set(MSN_PARAMS))
    if unknown:
        raise ConfigError(
            f"{key} has no key(s) {unknown}; NAME msn takes {sorted(MSN_PARAMS)} (VISSL's).",
            f"{key}.{unknown[0]}",
        )
    ratio = params.get("drop_ratio", MSN_PARAMS["drop_ratio"])
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio < 1:
        raise ConfigError(
            f"{key}.drop_ratio must be a number in [0, 1) (the fraction of the patches "
            f"dropped in training; VISSL's msn_deits16: 0.7), got {ratio!r}.",
            f"{key}.drop_ratio",
        )
    tokens = params.get("global_view_tokens", MSN_PARAMS["global_view_tokens"])
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ConfigError(
            f"{key}.global_view_tokens must be an integer >= 0 (inputs of fewer patches are "
            f"not dropped; VISSL: 196, 0 drops from every input), got {tokens!r}.",
            f"{key}.global_view_tokens",
        )
    return {"drop_ratio": float(ratio), "global_view_tokens": tokens}


# --------------------------------------------------------------------------- modules
def _init_linear(m: nn.Linear, init: str, qkv: bool) -> None:
    """One Linear layer of the trunk, by INIT (see ``INITS``); zero bias."""
    if init in ("default", "ijepa"):
        nn.init.trunc_normal_(m.weight, std=0.02)
    elif init == "moco_v3" and qkv:
        # q, k and v each as a (D, D) matrix: fan_out D, not 3 D
        bound = math.sqrt(6.0 / (m.weight.shape[0] // 3 + m.weight.shape[1]))
        nn.init.uniform_(m.weight, -bound, bound)
    else:  # mae (the fused qkv as one matrix, as timm's Block), moco_v3
        nn.init.xavier_uniform_(m.weight)
    if m.bias is not None:
        nn.init.zeros_(m.bias)


def _checkpointing(module: nn.Module) -> bool:
    """Recompute activations only where they would be kept for a backward pass."""
    return module.training and torch.is_grad_enabled()


class PatchEmbed(nn.Module):
    """Cut the image into ``patch_size`` squares and project each to ``embed_dim``."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, H/p * W/p, D), patches in row-major order."""
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention through ``F.scaled_dot_product_attention``.

    Args:
        dim: token width D.
        num_heads: heads; each attends in D / num_heads channels.
        qkv_bias: biases in the q, k, v projection.
        qk_scale: the attention-logit scale; ``None``: 1/sqrt(D / num_heads).
        attn_drop: dropout on the attention weights (training only).
        proj_drop: dropout after the output projection.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = qk_scale if qk_scale is not None else (dim // num_heads) ** -0.5
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, dim = x.shape
        qkv = self.qkv(x).reshape(n, length, 3, self.num_heads, dim // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (N, heads, L, D / heads)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop if self.training else 0.0, scale=self.scale
        )
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(n, length, dim)))

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, scale={self.scale:.4g}, attn_drop={self.attn_drop}"


class Mlp(nn.Module):
    """fc1 -> GELU -> dropout -> fc2 -> dropout."""

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class LayerScale(nn.Module):
    """Per-channel scaling of a residual branch, ``x * gamma`` (CaiT; DINOv2's ``ls1``/``ls2``).

    Args:
        dim: channels.
        init_values: the initial value of every entry of ``gamma``.
    """

    def __init__(self, dim: int, init_values: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``.

    Both residual branches go through stochastic depth (``drop_path``, per sample) and,
    with ``init_values``, layer scale (``ls1``, ``ls2``). With ``checkpoint_mlp`` the MLP's
    activations are recomputed in the backward pass instead of being stored (training with
    gradients only).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_dim: int,
        qkv_bias: bool = False,
        qk_scale: float | None = None,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        checkpoint_mlp: bool = False,
        init_values: float | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.attn = Attention(dim, num_heads, qkv_bias, qk_scale, attn_drop, drop)
        self.ls1: nn.Module = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path: nn.Module = (
            StochasticDepth(drop_path, mode="row") if drop_path > 0 else nn.Identity()
        )
        self.norm2 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.mlp = Mlp(dim, mlp_dim, drop)
        self.ls2: nn.Module = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.checkpoint_mlp = checkpoint_mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x))))
        y = self.norm2(x)
        if self.checkpoint_mlp and _checkpointing(self):
            y = checkpoint(self.mlp, y, use_reentrant=False)
        else:
            y = self.mlp(y)
        return x + self.drop_path(self.ls2(y))


# --------------------------------------------------------------------------- features
_FEATURE_NAME = re.compile(r"^(last|blk|concat)(CLS|POOL|MAP|BLK|PATCH)(\d*)$")


@dataclass(frozen=True)
class _FeatureSpec:
    kind: str  # CLS | POOL | MAP | BLK | PATCH
    blocks: tuple[int, ...]  # block indices whose (normed) outputs are concatenated


def _feature_names_help(num_layers: int) -> str:
    kinds = ("CLS", "POOL", "MAP", "BLK", "PATCH")
    return (
        ", ".join(f"last{k}" for k in kinds)
        + "; "
        + ", ".join(f"blk{k}<i>" for k in kinds)
        + f" (i in 0..{num_layers - 1}); "
        + ", ".join(f"concat{k}<n>" for k in kinds)
        + f" (n in 1..{num_layers})"
    )


def parse_feature_name(name: str, num_layers: int) -> _FeatureSpec:
    """The blocks and token selection of a VISSL ViT feature name.

    Raises:
        ConfigError: an unknown name or a block index out of range.
    """
    match = _FEATURE_NAME.match(name) if isinstance(name, str) else None
    if match is not None:
        where, kind, number = match.groups()
        if where == "last" and not number:
            return _FeatureSpec(kind, (num_layers - 1,))
        if where == "blk" and number and int(number) < num_layers:
            return _FeatureSpec(kind, (int(number),))
        if where == "concat" and number and 1 <= int(number) <= num_layers:
            return _FeatureSpec(kind, tuple(range(num_layers - int(number), num_layers)))
    raise ConfigError(
        f"vision_transformer has no feature named {name!r} (it has {num_layers} blocks). "
        f"Available: {_feature_names_help(num_layers)}. Check the feature names in "
        f"{_FEATURES_KEY}.",
        _FEATURES_KEY,
    )


# --------------------------------------------------------------------------- trunk
@register_model_trunk("vision_transformer")
class VisionTransformer(nn.Module):
    """Vision Transformer; with DROP_PATH_RATE > 0 it is a DeiT.

    Args:
        model_config: config.MODEL; reads TRUNK.VISION_TRANSFORMERS, INPUT_TYPE and
            ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING (checkpoint every block).
        model_name: the registry name (unused; kept for VISSL's constructor signature).

    Raises:
        ConfigError: an invalid VISION_TRANSFORMERS value (see :func:`parse_vit_config`).
    """

    #: Parameters that should get no weight decay, besides the LayerNorms and biases
    #: (relative names, as timm's ``no_weight_decay``), where the trunk has them.
    NO_WEIGHT_DECAY: ClassVar[frozenset[str]] = frozenset(
        {"pos_embed", "cls_token", "register_tokens", "patch_masking.masked_embed"}
    )

    def __init__(
        self, model_config: Mapping[str, Any], model_name: str = "vision_transformer"
    ) -> None:
        super().__init__()
        self.model_config = model_config
        self.settings = s = parse_vit_config(cfg_get(model_config, "TRUNK.VISION_TRANSFORMERS"))
        self.input_type = cfg_get(model_config, "INPUT_TYPE", "rgb")
        in_chans = input_channels(self.input_type)
        self.patch_size = s.patch_size
        self.grid_size = s.image_size // s.patch_size
        self.embed_dim = self.num_features = self.output_dim = s.hidden_dim
        self.classifier = s.classifier
        self.use_class_token = s.use_class_token
        self.num_register_tokens = s.num_register_tokens
        #: tokens before the patches: the class token (if any), then the registers
        self.num_prefix_tokens = int(s.use_class_token) + s.num_register_tokens
        self.masking = s.masking
        self.checkpoint_blocks = s.checkpoint_block or bool(
            cfg_get(model_config, "ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING", False)
        )
        logger.info(
            "Building vision_transformer: %dx%d px, patch %d, width %d, %d blocks, %d heads, "
            "MLP %d, classifier %s",
            s.image_size,
            s.image_size,
            s.patch_size,
            s.hidden_dim,
            s.num_layers,
            s.num_heads,
            s.mlp_dim,
            s.classifier,
        )

        self.patch_embed = PatchEmbed(s.patch_size, in_chans, s.hidden_dim)
        self.cls_token: nn.Parameter | None = (
            nn.Parameter(torch.zeros(1, 1, s.hidden_dim)) if s.use_class_token else None
        )
        # POS_EMBED sincos: a frozen parameter (MAE's and I-JEPA's), so that checkpoints,
        # exports and WEIGHTS_INIT hold it under the same key as the learned one
        self.pos_embed = nn.Parameter(
            torch.zeros(1, int(s.use_class_token) + self.grid_size**2, s.hidden_dim),
            requires_grad=s.pos_embed == "learned",
        )
        self._sincos_cache: dict[tuple[int, int, torch.device, torch.dtype], torch.Tensor] = {}
        self.pos_drop = nn.Dropout(s.dropout_rate)
        # stochastic depth grows linearly from 0 (first block) to DROP_PATH_RATE (last)
        rates = torch.linspace(0, s.drop_path_rate, s.num_layers, device="cpu").tolist()
        self.blocks = nn.ModuleList(
            Block(
                s.hidden_dim,
                s.num_heads,
                s.mlp_dim,
                qkv_bias=s.qkv_bias,
                qk_scale=s.qk_scale,
                drop=s.dropout_rate,
                attn_drop=s.attention_dropout_rate,
                drop_path=rate,
                checkpoint_mlp=s.checkpoint_mlp and not self.checkpoint_blocks,
                init_values=s.init_values,
            )
            for rate in rates
        )
        self.norm = nn.LayerNorm(s.hidden_dim, eps=LAYER_NORM_EPS)
        self._init_weights()
        # Built after the initialisation above, so that the options (off by default) leave
        # the random draws of every other parameter as they were.
        self.register_tokens: nn.Parameter | None = None
        if s.num_register_tokens:
            self.register_tokens = nn.Parameter(torch.zeros(1, s.num_register_tokens, s.hidden_dim))
            nn.init.normal_(self.register_tokens, std=1e-6)  # DINOv2's init
        self.patch_masking: nn.Module | None = None
        if s.masking == "ibot":
            self.patch_masking = MaskToken(s.hidden_dim)
        if s.freeze_patch_embed:
            # MoCo v3's random patch projection: the random init stays, never trained
            self.patch_embed.requires_grad_(False)
            logger.info("FREEZE_PATCH_EMBED: the patch projection keeps its random init")

    def _init_weights(self) -> None:
        """The position embedding (POS_EMBED) and INIT's initialisation (see ``INITS``).

        ``default``: truncated normal (std 0.02) for the embeddings and Linear weights, zero
        biases, unit LayerNorms; the patch projection keeps PyTorch's default (as in DINO).
        A learned position embedding is truncated normal (std 0.02) with every INIT.
        """
        init = self.settings.init
        if self.settings.pos_embed == "sincos":
            with torch.no_grad():
                self.pos_embed.copy_(self._sincos_table(self.grid_size, self.grid_size))
        else:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            if init == "mae":
                nn.init.normal_(self.cls_token, std=0.02)
            elif init == "moco_v3":
                nn.init.normal_(self.cls_token, std=1e-6)
            else:
                nn.init.trunc_normal_(self.cls_token, std=0.02)
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear):
                _init_linear(m, init, qkv=name.endswith("attn.qkv"))
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        proj = self.patch_embed.proj
        if init in ("mae", "moco_v3"):
            # as a Linear on the flattened patch: fan_in C p p, fan_out D
            nn.init.xavier_uniform_(proj.weight.view(proj.weight.shape[0], -1))
            if init == "moco_v3" and proj.bias is not None:
                nn.init.zeros_(proj.bias)  # MAE keeps the Conv2d's default bias
        elif init == "ijepa":
            nn.init.trunc_normal_(proj.weight, std=0.02)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
            with torch.no_grad():  # I-JEPA's fix_init_weight
                for i, block in enumerate(self.blocks):
                    assert isinstance(block, Block)
                    block.attn.proj.weight.div_(math.sqrt(2.0 * (i + 1)))
                    block.mlp.fc2.weight.div_(math.sqrt(2.0 * (i + 1)))

    def _sincos_table(self, height: int, width: int) -> torch.Tensor:
        """POS_EMBED sincos for a ``height`` x ``width`` grid, ``(1, [1 +] h * w, D)``.

        The IMAGE_SIZE grid (``G`` patches a side) gets the sin-cos of the patch indices
        0..G-1 (MAE's ``get_2d_sincos_pos_embed``: the column's channels first; the class
        token's entry 0). Another grid gets the sin-cos at the positions a bicubic resize
        of that table samples (``(j + 0.5) G / h - 0.5``), so that a crop's patches keep the
        positions of the whole image, as the learned table's interpolation does, but exact.
        """
        grid = self.grid_size

        def positions(n: int) -> torch.Tensor:
            return (torch.arange(n, dtype=torch.float64) + 0.5) * (grid / n) - 0.5

        table = sincos_2d_embedding(
            positions(height), positions(width), self.embed_dim, columns_first=True
        )
        if self.use_class_token:
            table = torch.cat((torch.zeros(1, self.embed_dim), table), dim=0)
        return table.unsqueeze(0)

    def no_weight_decay(self) -> set[str]:
        """Names (relative to the trunk) of the embedding parameters to exclude from
        weight decay, as timm's ``no_weight_decay``. LayerNorms and biases are excluded by
        the optimizer's ``regularize_bn`` / ``regularize_bias`` settings."""
        names = {name for name, _ in self.named_parameters()}
        return {name for name in self.NO_WEIGHT_DECAY if name in names}

    # ----------------------------------------------------------------- forward
    def interpolate_pos_encoding(self, height: int, width: int) -> torch.Tensor:
        """The position embedding for a ``height`` x ``width`` grid of patches.

        The IMAGE_SIZE grid's patch embeddings are resized bicubically (as DINO does for
        multi-crop); the class token's embedding is kept.

        Returns:
            (1, [1 +] height * width, D): the class token's entry first when there is one.
        """
        if height == self.grid_size and width == self.grid_size:
            return self.pos_embed
        dim = self.pos_embed.shape[-1]
        prefix = int(self.use_class_token)
        if self.settings.pos_embed == "sincos":
            key = (height, width, self.pos_embed.device, self.pos_embed.dtype)
            table = self._sincos_cache.get(key)
            if table is None:
                table = self._sincos_table(height, width).to(self.pos_embed)
                self._sincos_cache[key] = table
            # the class token's entry is the parameter's (0, or a checkpoint's)
            return torch.cat((self.pos_embed[:, :prefix], table[:, prefix:]), dim=1)
        cls_pos, patch_pos = self.pos_embed[:, :prefix], self.pos_embed[:, prefix:]
        grid = patch_pos.reshape(1, self.grid_size, self.grid_size, dim).permute(0, 3, 1, 2)
        grid = F.interpolate(
            grid.float(), size=(height, width), mode="bicubic", align_corners=False
        ).to(patch_pos.dtype)
        patch_pos = grid.permute(0, 2, 3, 1).reshape(1, height * width, dim)
        return torch.cat((cls_pos, patch_pos), dim=1) if prefix else patch_pos

    def prepare_tokens(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, tuple[int, int]]:
        """Patch embedding, masking, class token, registers and position embedding.

        Args:
            x: images (N, C, H, W).
            mask: optional patch mask (N, h, w) or (N, h*w), True = masked; what it does
                is MASKED_IMAGE_MODELING.NAME's (see the module docstring).

        Returns:
            The tokens (N, prefix + patches, D) and the patch grid (h, w).

        Raises:
            ConfigError: the image sides are not multiples of PATCH_SIZE, or a mask is given
                to a trunk without MASKED_IMAGE_MODELING.
            ValueError: the mask does not fit the images (shape, or unequal visible counts).
        """
        if x.ndim != 4:
            raise ValueError(
                f"vision_transformer expects images of shape (N, C, H, W); got {tuple(x.shape)}."
            )
        height, width = x.shape[-2:]
        p = self.patch_size
        if height % p or width % p:
            raise ConfigError(
                f"vision_transformer got {height}x{width} px images, but both sides must be "
                f"multiples of {_KEY}.PATCH_SIZE={p}. Resize or crop the images to a multiple "
                f"of {p} in the data transforms (e.g. {max(p, height // p * p)}x"
                f"{max(p, width // p * p)}), or choose a PATCH_SIZE that divides every crop size.",
                f"{_KEY}.PATCH_SIZE",
            )
        grid = (height // p, width // p)
        batch = x.shape[0]
        patches = self.patch_embed(x)
        flat_mask = None
        if mask is not None:
            if not self.masking:
                raise ConfigError(
                    "vision_transformer received a patch mask but "
                    f"{_KEY}.MASKED_IMAGE_MODELING.NAME is empty: set it to 'mae' (encode "
                    "the visible patches only) or 'ibot' (a learned mask token replaces the "
                    "masked patches).",
                    f"{_KEY}.MASKED_IMAGE_MODELING.NAME",
                )
            flat_mask = flatten_mask(mask.to(patches.device), grid, batch)
            if self.patch_masking is not None:  # ibot: the mask token before the position
                patches = self.patch_masking(patches, flat_mask)
        pos = self.interpolate_pos_encoding(*grid)
        prefix = int(self.use_class_token)
        patches = patches + pos[:, prefix:]
        if flat_mask is not None and self.masking in ("mae", "msn"):
            patches = gather_tokens(patches, keep_indices(flat_mask, visible_count(flat_mask)))
        elif flat_mask is None and self._msn_drops(grid):
            # one set for the whole batch, from the global generator (as VISSL and MSN)
            num = grid[0] * grid[1]
            keep = int(num * (1.0 - self.settings.drop_ratio))
            kept = torch.randperm(num)[:keep].sort().values.to(patches.device)
            patches = patches[:, kept]
        parts = []
        if self.cls_token is not None:
            parts.append((self.cls_token + pos[:, :prefix]).expand(batch, -1, -1))
        if self.register_tokens is not None:
            parts.append(self.register_tokens.expand(batch, -1, -1))
        tokens = torch.cat((*parts, patches), dim=1) if parts else patches
        return self.pos_drop(tokens), grid

    def _msn_drops(self, grid: tuple[int, int]) -> bool:
        """Whether the msn masking drops patches of an unmasked input of this grid."""
        return (
            self.masking == "msn"
            and self.training
            and self.settings.drop_ratio > 0
            and grid[0] * grid[1] >= self.settings.global_view_tokens
        )

    def _run_block(self, block: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_blocks and _checkpointing(self):
            out = checkpoint(block, tokens, use_reentrant=False)
            assert isinstance(out, torch.Tensor)
            return out
        return block(tokens)

    def _select(self, kind: str, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        patches = tokens[:, self.num_prefix_tokens :]
        if kind == "CLS":
            return tokens[:, 0]
        if kind == "POOL":
            return patches.mean(dim=1)
        if kind == "MAP":
            n, _, dim = patches.shape
            return patches.transpose(1, 2).reshape(n, dim, *grid)
        if kind == "PATCH" or not self.use_class_token:
            return patches
        if self.num_register_tokens:  # BLK: the class token and the patches
            return torch.cat((tokens[:, :1], patches), dim=1)
        return tokens

    def default_feature_name(self) -> str:
        """The feature returned without ``out_feat_keys``: lastCLS (token) or lastPOOL (gap)."""
        return "lastCLS" if self.classifier == "token" else "lastPOOL"

    def _check_features(self, names: list[str], specs: list[_FeatureSpec], masked: bool) -> None:
        for name, spec in zip(names, specs):
            if spec.kind == "CLS" and not self.use_class_token:
                raise ConfigError(
                    f"vision_transformer feature {name!r} is a class token, but "
                    f"{_KEY}.USE_CLASS_TOKEN is False: use a POOL, PATCH or MAP feature "
                    f"(e.g. lastPOOL) in {_FEATURES_KEY} and the heads' mappings.",
                    f"{_KEY}.USE_CLASS_TOKEN",
                )
            if spec.kind == "MAP" and masked and self.masking in ("mae", "msn"):
                raise ConfigError(
                    f"vision_transformer feature {name!r} (a map of every patch) cannot be "
                    "computed from the visible patches only (MASKED_IMAGE_MODELING.NAME: "
                    f"{self.masking}): use lastPATCH or lastBLK with a mask, or no mask "
                    "(msn: or eval mode).",
                    _FEATURES_KEY,
                )

    def forward(
        self,
        x: torch.Tensor,
        out_feat_keys: list[str] | None = None,
        mask: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Return the features named in ``out_feat_keys`` (default: the CLASSIFIER output).

        Args:
            x: images (N, C, H, W).
            out_feat_keys: feature names (see the module docstring).
            mask: optional patch mask, True = masked (MASKED_IMAGE_MODELING must be set).

        Blocks run only up to the deepest block a requested feature needs.
        """
        names = list(out_feat_keys) if out_feat_keys else [self.default_feature_name()]
        specs = [parse_feature_name(name, len(self.blocks)) for name in names]
        p = self.patch_size
        grid = (int(x.shape[-2]) // p, int(x.shape[-1]) // p) if x.ndim == 4 else (0, 0)
        self._check_features(names, specs, mask is not None or self._msn_drops(grid))
        wanted = {i for spec in specs for i in spec.blocks}
        tokens, grid = self.prepare_tokens(
            transform_model_input_data_type(x, self.input_type), mask
        )
        normed: dict[int, torch.Tensor] = {}
        for i, block in enumerate(self.blocks[: max(wanted) + 1]):
            tokens = self._run_block(block, tokens)
            if i in wanted:
                normed[i] = self.norm(tokens)
        outputs = []
        for spec in specs:
            feats = [self._select(spec.kind, normed[i], grid) for i in spec.blocks]
            outputs.append(
                feats[0]
                if len(feats) == 1
                else torch.cat(feats, dim=1 if spec.kind == "MAP" else -1)
            )
        return outputs


class MaskToken(nn.Module):
    """iBOT's / BEiT's mask token: masked patches' embeddings become ``masked_embed``.

    ``masked_embed`` (1, D) starts at zero, as in iBOT and VISSL
    (``patch_masking.masked_embed``).
    """

    def __init__(self, embed_dim: int) -> None:
        super().__init__()
        self.masked_embed = nn.Parameter(torch.zeros(1, embed_dim))

    def forward(self, patches: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``patches`` (N, L, D) with the rows where ``mask`` (N, L) is True replaced."""
        return torch.where(mask.unsqueeze(-1), self.masked_embed.to(patches.dtype), patches)

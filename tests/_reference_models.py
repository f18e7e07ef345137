"""Small models named as other code bases name theirs, written here from their naming schemes.

They stand in for weights of VISSL, ClassyVision, DINO and detectron2 in the checkpoint
compatibility tests (no download, no VISSL file): each builds the state dict a real
checkpoint of that code base holds and computes what that code base computes, so a test
can load its weights into our trunks and compare features.

- :class:`VisslRegNet`: VISSL's ``regnet`` trunk, i.e. ClassyVision's RegNet blocks
  (``conv1.stem.{0,1}``, ``proj``/``bn``, ``f.a``/``f.b``/``f.se.excitation``/``f.c``/
  ``f.final_bn``) under ``_feature_blocks.conv1`` and ``_feature_blocks.res{s+1}``.
- :class:`DinoViT`: DINO's (and VISSL's) VisionTransformer (``patch_embed.proj``,
  ``cls_token``, ``pos_embed``, ``blocks.{i}.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,
  mlp.fc2}``, ``norm``), attention written out by hand.
- :class:`ClassyViT`: ClassyVision's VisionTransformer (``conv_proj``, ``class_token``,
  ``encoder.pos_embedding`` sequence first, ``encoder.layers.layer_{i}.{ln_1,
  self_attention,ln_2,mlp.linear_1,mlp.linear_2}``, ``encoder.ln``) with
  ``nn.MultiheadAttention``, as VISSL's ``classy_vit`` trunk holds it under ``model``.
- :class:`ClassyResNet`: ClassyVision's ResNe(X)t (``initial_block._module``,
  ``blocks.{s}.block{s}-{i}.convolutional_block``, ``bn``, ``downsample``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights everywhere, BatchNorm statistics included (so eval-mode outputs
    depend on every tensor), and eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not tensor.is_floating_point():
                continue
            if name.endswith("running_var"):
                tensor.copy_(torch.rand(tensor.shape, generator=gen) + 0.5)
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=gen) * 0.2)
    return model.eval()


# ------------------------------------------------------------------ VISSL / ClassyVision RegNet
class _SqueezeExcitation(nn.Module):
    def __init__(self, width: int, reduced: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.excitation = nn.Sequential(
            nn.Conv2d(width, reduced, 1, bias=True),
            nn.ReLU(),
            nn.Conv2d(reduced, width, 1, bias=True),
            nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.excitation(self.avgpool(x))


class _BottleneckTransform(nn.Module):
    def __init__(
        self, w_in: int, w_out: int, stride: int, group_width: int, se_ratio: float | None
    ) -> None:
        super().__init__()
        self.a = nn.Sequential(
            nn.Conv2d(w_in, w_out, 1, bias=False), nn.BatchNorm2d(w_out), nn.ReLU()
        )
        self.b = nn.Sequential(
            nn.Conv2d(
                w_out, w_out, 3, stride=stride, padding=1, groups=w_out // group_width, bias=False
            ),
            nn.BatchNorm2d(w_out),
            nn.ReLU(),
        )
        self.se = _SqueezeExcitation(w_out, round(se_ratio * w_in)) if se_ratio else None
        self.c = nn.Conv2d(w_out, w_out, 1, bias=False)
        self.final_bn = nn.BatchNorm2d(w_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b(self.a(x))
        if self.se is not None:
            x = self.se(x)
        return self.final_bn(self.c(x))


class _ResBottleneckBlock(nn.Module):
    def __init__(
        self, w_in: int, w_out: int, stride: int, group_width: int, se_ratio: float | None
    ) -> None:
        super().__init__()
        self.proj_block = w_in != w_out or stride != 1
        if self.proj_block:
            self.proj = nn.Conv2d(w_in, w_out, 1, stride=stride, bias=False)
            self.bn = nn.BatchNorm2d(w_out)
        self.f = _BottleneckTransform(w_in, w_out, stride, group_width, se_ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = self.bn(self.proj(x)) if self.proj_block else x
        return F.relu(shortcut + self.f(x))


class _SimpleStem(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stem(x)


class VisslRegNet(nn.Module):
    """VISSL's ``regnet`` trunk: ClassyVision's RegNet blocks under ``_feature_blocks``.

    Args:
        widths, depths: per stage.
        stem_width: the stem's output width.
        group_width: channels per group of the 3x3 convolutions.
        se_ratio: squeeze-and-excitation width as a fraction of each block's input width
            (None: no SE, a RegNetX).
    """

    def __init__(
        self,
        widths: Sequence[int],
        depths: Sequence[int],
        stem_width: int,
        group_width: int,
        se_ratio: float | None = 0.25,
    ) -> None:
        super().__init__()
        blocks: list[tuple[str, nn.Module]] = [("conv1", _SimpleStem(stem_width))]
        w_in = stem_width
        for s, (width, depth) in enumerate(zip(widths, depths, strict=True), start=1):
            stage = nn.Sequential()
            for i in range(depth):
                block = _ResBottleneckBlock(
                    w_in if i == 0 else width, width, 2 if i == 0 else 1, group_width, se_ratio
                )
                stage.add_module(f"block{s}-{i}", block)
            blocks.append((f"res{s + 1}", stage))
            w_in = width
        self._feature_blocks = nn.ModuleDict(OrderedDict(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self._feature_blocks.values():
            x = block(x)
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)


# ------------------------------------------------------------------ DINO / VISSL ViT
class _DinoAttention(nn.Module):
    def __init__(self, dim: int, heads: int, qkv_bias: bool) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class _DinoMlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _DinoBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_dim: int, qkv_bias: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _DinoAttention(dim, heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = _DinoMlp(dim, mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _PatchEmbed(nn.Module):
    def __init__(self, patch: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, stride=patch)


class DinoViT(nn.Module):
    """DINO's VisionTransformer (VISSL's ``vision_transformer`` has the same names).

    ``forward`` returns the class token after the last block and the final LayerNorm.
    """

    def __init__(
        self,
        image: int,
        patch: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_dim: int,
        qkv_bias: bool = True,
    ) -> None:
        super().__init__()
        self.patch_embed = _PatchEmbed(patch, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + (image // patch) ** 2, dim))
        self.blocks = nn.ModuleList(_DinoBlock(dim, heads, mlp_dim, qkv_bias) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.norm(x)[:, 0]


# ------------------------------------------------------------------ ClassyVision ViT
class _ClassyMlp(nn.Sequential):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.linear_2 = nn.Linear(hidden, dim)


class _ClassyEncoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = _ClassyMlp(dim, mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (S, N, D)
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class _ClassyEncoder(nn.Module):
    def __init__(self, seq: int, dim: int, depth: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.zeros(seq, 1, dim))
        self.layers = nn.Sequential(
            OrderedDict(
                (f"layer_{i}", _ClassyEncoderBlock(dim, heads, mlp_dim)) for i in range(depth)
            )
        )
        self.ln = nn.LayerNorm(dim, eps=1e-6)


class _ClassyViTModel(nn.Module):
    def __init__(
        self, image: int, patch: int, dim: int, depth: int, heads: int, mlp_dim: int, token: bool
    ) -> None:
        super().__init__()
        self.conv_proj = nn.Conv2d(3, dim, patch, stride=patch)
        seq = (image // patch) ** 2
        self.token = token
        if token:
            self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
            seq += 1
        self.encoder = _ClassyEncoder(seq, dim, depth, heads, mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        x = self.conv_proj(x).flatten(2).permute(2, 0, 1)  # (S, N, D)
        if self.token:
            x = torch.cat([self.class_token.expand(-1, n, -1), x], dim=0)
        x = x + self.encoder.pos_embedding
        x = self.encoder.ln(self.encoder.layers(x))
        return x[0] if self.token else x.mean(dim=0)


class ClassyViT(nn.Module):
    """VISSL's ``classy_vit`` trunk: ClassyVision's VisionTransformer under ``model``."""

    def __init__(
        self,
        image: int,
        patch: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_dim: int,
        token: bool = True,
    ) -> None:
        super().__init__()
        self.model = _ClassyViTModel(image, patch, dim, depth, heads, mlp_dim, token)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


# ------------------------------------------------------------------ ClassyVision ResNe(X)t
class _ClassyResLayer(nn.Module):
    def __init__(
        self, w_in: int, w_mid: int, w_out: int, stride: int, groups: int, bottleneck: bool
    ) -> None:
        super().__init__()
        if bottleneck:
            self.convolutional_block = nn.Sequential(
                nn.Conv2d(w_in, w_mid, 1, bias=False),
                nn.BatchNorm2d(w_mid),
                nn.ReLU(),
                nn.Conv2d(w_mid, w_mid, 3, stride=stride, padding=1, groups=groups, bias=False),
                nn.BatchNorm2d(w_mid),
                nn.ReLU(),
                nn.Conv2d(w_mid, w_out, 1, bias=False),
            )
        else:
            self.convolutional_block = nn.Sequential(
                nn.Conv2d(w_in, w_out, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(w_out),
                nn.ReLU(),
                nn.Conv2d(w_out, w_out, 3, padding=1, bias=False),
            )
        self.bn = nn.BatchNorm2d(w_out)
        self.downsample: nn.Module | None = None
        if stride != 1 or w_in != w_out:
            self.downsample = nn.Sequential(
                nn.Conv2d(w_in, w_out, 1, stride=stride, bias=False), nn.BatchNorm2d(w_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x if self.downsample is None else self.downsample(x)
        return F.relu(self.bn(self.convolutional_block(x)) + residual)


class _ClassyInitialBlock(nn.Module):
    def __init__(self, width: int, small_input: bool) -> None:
        super().__init__()
        if small_input:
            self._module = nn.Sequential(
                nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
            )
        else:
            self._module = nn.Sequential(
                nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.MaxPool2d(3, stride=2, padding=1),
            )


class ClassyResNet(nn.Module):
    """ClassyVision's ResNe(X)t trunk (its ``blocks`` end with the last stage).

    Args:
        layers: blocks per stage.
        width: the stem's width (64 for torchvision's and ClassyVision's ResNets).
        bottleneck: bottleneck (ResNet-50 and deeper) or basic blocks.
        groups, width_per_group: ResNeXt's cardinality and group width.
        small_input: ClassyVision's small-input stem (3x3, stride 1, no max-pool).
    """

    def __init__(
        self,
        layers: Sequence[int],
        width: int = 64,
        bottleneck: bool = True,
        groups: int = 1,
        width_per_group: int = 64,
        small_input: bool = False,
    ) -> None:
        super().__init__()
        self.initial_block = _ClassyInitialBlock(width, small_input)
        expansion = 4 if bottleneck else 1
        stages = []
        w_in = width
        for s, depth in enumerate(layers):
            planes = width * 2**s
            w_mid = int(planes * width_per_group / 64) * groups
            w_out = planes * expansion
            stage = OrderedDict()
            for i in range(depth):
                stage[f"block{s}-{i}"] = _ClassyResLayer(
                    w_in if i == 0 else w_out,
                    w_mid,
                    w_out,
                    (1 if s == 0 else 2) if i == 0 else 1,
                    groups,
                    bottleneck,
                )
            stages.append(nn.Sequential(stage))
            w_in = w_out
        self.blocks = nn.Sequential(*stages)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.initial_block._module(x))
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)

"""``ibot_head``: iBOT's head (VISSL's name and arguments), used by iBOT and DINOv2.

One MLP for every token, ``in_dim -> hidden_dim -> ... -> bottleneck_dim`` (``num_layers``
Linear layers, the activation between them, optional ``norm`` after the hidden ones), L2
normalisation, then weight-normalised last layers (rows ``V / ||V||``, the scale fixed at
1 with ``normalize_last_layer``, as :class:`~vissl.models.heads.dino_head.WeightNormLinear`):
``prototypes0`` (``out_dim``) scores the class token, ``prototypes1`` (``patch_out_dim``)
the patch tokens. With ``shared_head`` both are the same layer, ``prototypes0``
(``prototypes1`` is then an attribute, not a second registration, so parameter names are
unique; ``MODEL.TEMP_FROZEN_PARAMS_ITER_MAP`` still accepts ``heads.0.prototypes1.weight``
and VISSL's ``weight_v`` / ``weight_g`` names).

Inputs and outputs:

- ``(N, D)`` (``lastCLS``, the local crops): ``[cls_logits (N, out_dim)]``.
- ``(N, 1 + L, D)`` (``lastBLK``: the class token, then the patches; the global crops):
  ``[cls_logits (N, out_dim), patch_logits (N, L, patch_out_dim)]``. With
  ``masked_patches_only`` and a ``mask`` (``(N, h, w)`` or ``(N, L)``, True = masked), the
  patch logits are those of the masked patches only, ``(M, patch_out_dim)`` in mask order
  (DINOv2 runs its head on the masked patches only: less memory and compute for 65536
  prototypes). With ``output_cls_token`` the trunk's class token (the input's row 0) is
  appended, ``(N, D)``: DINOv2's KoLeo regulariser reads it.

The MLP runs on the class tokens and the patch tokens together (one batch of rows), so a
BatchNorm ``norm`` sees both, as iBOT's does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from vissl.config.params import IntAtLeast, Note, OneOf
from vissl.errors import ConfigError
from vissl.models.heads import parse_head, register_model_head
from vissl.models.heads.dino_head import WeightNormLinear
from vissl.models.model_helpers import cfg_get
from vissl.models.token_masking import flatten_mask

_KEY = "config.MODEL.HEAD.PARAMS"
NORMS = (None, "bn", "syncbn", "ln")
ACTIVATIONS = ("gelu", "relu")


PosInt = Annotated[int, IntAtLeast(1)]
Norm = Annotated[str | None, OneOf(*NORMS[1:]), Note("or null: no norm")]


@dataclass(kw_only=True, frozen=True)
class IBOTHeadParams:
    """ibot_head's arguments (iBOT's iBOTHead defaults).

    ``patch_out_dim`` 0 (or null) means ``out_dim``; with ``shared_head`` it must equal ``out_dim``.
    """

    in_dim: PosInt
    out_dim: PosInt
    patch_out_dim: Annotated[int | None, IntAtLeast(0), Note("0 or null: out_dim")] = 0
    norm: Norm = None
    act: Annotated[str, OneOf(*ACTIVATIONS)] = "gelu"
    last_norm: Norm = None
    normalize_last_layer: bool = True
    num_layers: PosInt = 3
    hidden_dim: PosInt = 2048
    bottleneck_dim: PosInt = 256
    shared_head: bool = False
    masked_patches_only: bool = False
    output_cls_token: bool = False

    def check(self, key_path: str) -> None:
        patch_out_dim = self.patch_out_dim or self.out_dim
        if self.shared_head and patch_out_dim != self.out_dim:
            raise ConfigError(
                f"{key_path}: ibot_head with shared_head has one last layer, so patch_out_dim "
                f"({patch_out_dim}) must equal out_dim ({self.out_dim}) or be 0.",
                f"{key_path}.patch_out_dim",
            )


def _norm(kind: str | None, width: int, affine: bool, eps: float, momentum: float) -> nn.Module:
    if kind is None:
        return nn.Identity()
    if kind == "bn":
        return nn.BatchNorm1d(width, eps=eps, momentum=momentum, affine=affine)
    if kind == "syncbn":
        return nn.SyncBatchNorm(width, eps=eps, momentum=momentum, affine=affine)
    if kind == "ln":
        return nn.LayerNorm(width, elementwise_affine=affine)
    raise ConfigError(
        f"{_KEY}: ibot_head's norm / last_norm must be one of {list(NORMS)}, got {kind!r}.", _KEY
    )


@register_model_head("ibot_head")
class IBOTHead(nn.Module):
    """iBOT's projection head (see the module docstring).

    Args:
        model_config: config.MODEL (HEAD.BATCHNORM_EPS and HEAD.BATCHNORM_MOMENTUM are read).
        in_dim: the trunk's width.
        out_dim: the [CLS] output width (iBOT: 8192, DINOv2: 65536).
        patch_out_dim: the patch output width; 0: ``out_dim``.
        norm: None, ``bn``, ``syncbn`` or ``ln`` after each hidden Linear.
        act: ``gelu`` or ``relu``.
        last_norm: an affine-free norm on the logits (None, ``bn``, ``syncbn``, ``ln``).
        normalize_last_layer: fix the last layers' row norms at 1.
        num_layers: Linear layers before the last layer (at least 1).
        hidden_dim: width of the hidden layers.
        bottleneck_dim: width of the L2-normalised bottleneck.
        shared_head: one last layer for the class token and the patches.
        masked_patches_only: score only the masked patches when a mask is given.
        output_cls_token: also return the trunk's class token (for KoLeo).
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        in_dim: int,
        out_dim: int,
        patch_out_dim: int | None = IBOTHeadParams.patch_out_dim,
        norm: str | None = IBOTHeadParams.norm,
        act: str = IBOTHeadParams.act,
        last_norm: str | None = IBOTHeadParams.last_norm,
        normalize_last_layer: bool = IBOTHeadParams.normalize_last_layer,
        num_layers: int = IBOTHeadParams.num_layers,
        hidden_dim: int = IBOTHeadParams.hidden_dim,
        bottleneck_dim: int = IBOTHeadParams.bottleneck_dim,
        shared_head: bool = IBOTHeadParams.shared_head,
        masked_patches_only: bool = IBOTHeadParams.masked_patches_only,
        output_cls_token: bool = IBOTHeadParams.output_cls_token,
    ) -> None:
        super().__init__()
        p = parse_head(
            IBOTHeadParams,
            "ibot_head",
            {
                "in_dim": in_dim,
                "out_dim": out_dim,
                "patch_out_dim": patch_out_dim,
                "norm": norm,
                "act": act,
                "last_norm": last_norm,
                "normalize_last_layer": normalize_last_layer,
                "num_layers": num_layers,
                "hidden_dim": hidden_dim,
                "bottleneck_dim": bottleneck_dim,
                "shared_head": shared_head,
                "masked_patches_only": masked_patches_only,
                "output_cls_token": output_cls_token,
            },
        )
        in_dim, out_dim, patch_out_dim = p.in_dim, p.out_dim, p.patch_out_dim or p.out_dim
        num_layers, hidden_dim, bottleneck_dim = p.num_layers, p.hidden_dim, p.bottleneck_dim
        eps = float(cfg_get(model_config, "HEAD.BATCHNORM_EPS", 1e-5))
        momentum = float(cfg_get(model_config, "HEAD.BATCHNORM_MOMENTUM", 0.1))
        widths = [in_dim] + [hidden_dim] * (num_layers - 1) + [bottleneck_dim]
        layers: list[nn.Module] = []
        for i in range(num_layers):
            layers.append(nn.Linear(widths[i], widths[i + 1]))
            if i < num_layers - 1:
                if norm is not None:
                    layers.append(_norm(norm, widths[i + 1], True, eps, momentum))
                layers.append(nn.GELU() if act == "gelu" else nn.ReLU())
        self.mlp = nn.Sequential(*layers)
        for module in self.mlp.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        learn_scale = not p.normalize_last_layer
        self.prototypes0 = WeightNormLinear(bottleneck_dim, out_dim, learn_scale=learn_scale)
        # a shared layer is reached as prototypes1 / last_norm2 through the properties
        # below, not registered a second time (parameter names stay unique)
        if not shared_head:
            self._modules["prototypes1"] = WeightNormLinear(
                bottleneck_dim, patch_out_dim, learn_scale=learn_scale
            )
        # (WeightNormLinear starts as nn.Linear's default init, as iBOT's last layers)
        self.last_norm = _norm(last_norm, out_dim, False, eps, momentum)
        if not shared_head:
            self._modules["last_norm2"] = _norm(last_norm, patch_out_dim, False, eps, momentum)
        self.in_dim = in_dim
        self.output_dim = out_dim
        self.patch_output_dim = patch_out_dim
        self.shared_head = bool(shared_head)
        self.masked_patches_only = bool(masked_patches_only)
        self.output_cls_token = bool(output_cls_token)

    @property
    def prototypes1(self) -> nn.Module:
        """The patch tokens' last layer (``prototypes0`` with ``shared_head``)."""
        module = self._modules.get("prototypes1")
        return self.prototypes0 if module is None else module

    @property
    def last_norm2(self) -> nn.Module:
        """The patch logits' norm (``last_norm`` with ``shared_head``)."""
        module = self._modules.get("last_norm2")
        return self.last_norm if module is None else module

    def _bottleneck(self, rows: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.mlp(rows), dim=-1, p=2)

    def forward(
        self, x: torch.Tensor | list[torch.Tensor], mask: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """See the module docstring."""
        if isinstance(x, list | tuple):
            if len(x) != 1:
                raise ValueError(f"ibot_head takes one feature tensor, got {len(x)}.")
            x = x[0]
        if x.shape[-1] != self.in_dim:
            raise ConfigError(
                f"{_KEY}: ibot_head's in_dim is {self.in_dim} but its input has width "
                f"{x.shape[-1]} (the trunk's); set in_dim to {x.shape[-1]}.",
                _KEY,
            )
        if x.ndim == 2:  # class tokens only (local crops)
            return [self.last_norm(self.prototypes0(self._bottleneck(x)))]
        if x.ndim != 3 or x.shape[1] < 2:
            raise ValueError(
                "ibot_head expects (N, D) class tokens or (N, 1 + L, D) class and patch tokens "
                f"(lastBLK); got {tuple(x.shape)}."
            )
        n, length, dim = x.shape
        cls_token, patches = x[:, 0], x[:, 1:]
        select = self.masked_patches_only and mask is not None
        if select:
            assert mask is not None
            flat = flatten_mask(mask.reshape(n, -1).to(x.device), (1, length - 1), n)
            patch_rows = patches[flat]
        else:
            patch_rows = patches.reshape(-1, dim)
        z = self._bottleneck(torch.cat([cls_token, patch_rows]))
        cls_logits = self.last_norm(self.prototypes0(z[:n]))
        patch_logits = self.last_norm2(self.prototypes1(z[n:]))
        if not select:
            patch_logits = patch_logits.reshape(n, length - 1, -1)
        out = [cls_logits, patch_logits]
        if self.output_cls_token:
            out.append(cls_token)
        return out

    def extra_repr(self) -> str:
        return (
            f"in_dim={self.in_dim}, out_dim={self.output_dim}, "
            f"patch_out_dim={self.patch_output_dim}, shared_head={self.shared_head}, "
            f"masked_patches_only={self.masked_patches_only}"
        )

"""``dino_head``: DINO's projection MLP, bottleneck and weight-normalised last layer.

``in_dim -> hidden_dim -> ... -> hidden_dim -> bottleneck_dim`` (``num_layers`` Linear
layers, GELU between them, optional BatchNorm1d after the hidden ones), then the
bottleneck is L2-normalised and scored by ``prototypes0``, a bias-free linear layer of
``num_clusters[0]`` outputs whose rows are weight-normalised,
``W = g * V / ||V||`` (``torch.nn.utils.weight_norm`` in DINO). With
``normalize_last_layer`` the scale ``g`` is fixed at 1 (DINO's ``norm_last_layer``), which
stabilises training; otherwise each row has a learnable ``g``.

The direction ``V`` is the parameter ``heads.0.prototypes0.weight`` (the name SwAV's
prototypes use), so DINO's "freeze the last layer for the first epoch" is
``MODEL.TEMP_FROZEN_PARAMS_ITER_MAP: [["module.heads.0.prototypes0.weight", <iters>]]``.

Output: the logits, ``Tensor(N, num_clusters[0])`` (the model returns ``[logits]``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from vissl.config.params import IntAtLeast, Length, Note, check_value
from vissl.errors import ConfigError
from vissl.models.heads import parse_head, register_model_head
from vissl.models.model_helpers import cfg_get, flat_head_input

_KEY = "config.MODEL.HEAD.PARAMS"


PosInt = Annotated[int, IntAtLeast(1)]
#: DINO's output width: an integer or a list of one (VISSL's ``num_clusters: [65536]``).
NumClusters = (
    PosInt | Annotated[Sequence[PosInt], Length(1), Note("DINO has one last layer, e.g. [65536]")]
)


@dataclass(kw_only=True, frozen=True)
class DINOHeadParams:
    """dino_head's arguments (DINO's DINOHead defaults)."""

    in_dim: PosInt
    num_clusters: NumClusters = (65536,)
    use_bn: bool = False
    normalize_last_layer: bool = True
    num_layers: PosInt = 3
    hidden_dim: PosInt = 2048
    bottleneck_dim: PosInt = 256


def dino_output_dim(num_clusters: Any) -> int:
    """The output width of a dino_head from its ``num_clusters`` (an int or a list of one).

    Raises:
        ConfigError: not a positive integer or a list of one.
    """
    value = check_value(num_clusters, NumClusters, f"{_KEY}[dino_head].num_clusters")
    return value if isinstance(value, int) else value[0]


def init_like_linear_(weight: torch.Tensor) -> torch.Tensor:
    """``nn.Linear``'s default init of ``weight`` (out, in), in place: kaiming-uniform with
    ``a = sqrt(5)``, i.e. uniform in ``+-1/sqrt(in)``, rows of norm about ``sqrt(1/3)``.

    DINO's and iBOT's ``DINOHead`` create their weight-normalised last layer after
    ``self.apply(self._init_weights)`` (trunc-normal 0.02 for the MLP), so it keeps this
    init; so do VISSL's weight-normalised SwAV prototypes. It matters: the step of a
    weight-normalised direction scales as ``lr / ||V||``.
    """
    return nn.init.kaiming_uniform_(weight, a=math.sqrt(5))


class WeightNormLinear(nn.Module):
    """Bias-free ``y = x @ (g * V / ||V||_row).T``; ``g`` is 1 and fixed unless ``learn_scale``.

    ``V`` starts as ``nn.Linear``'s default init (:func:`init_like_linear_`), as DINO's
    ``weight_norm(nn.Linear(...))`` last layer.

    Args:
        in_dim: input width.
        out_dim: output width (number of rows of ``V``).
        learn_scale: a learnable per-row scale ``g`` (initialised at 1).
    """

    def __init__(self, in_dim: int, out_dim: int, learn_scale: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim))
        init_like_linear_(self.weight)
        self.scale: nn.Parameter | None = (
            nn.Parameter(torch.ones(out_dim, 1)) if learn_scale else None
        )

    def normalized_weight(self) -> torch.Tensor:
        weight = F.normalize(self.weight, dim=1, p=2)
        return weight * self.scale if self.scale is not None else weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.normalized_weight())

    def extra_repr(self) -> str:
        out_dim, in_dim = self.weight.shape
        return f"in_dim={in_dim}, out_dim={out_dim}, learn_scale={self.scale is not None}"


@register_model_head("dino_head")
class DINOHead(nn.Module):
    """DINO's projection head.

    Args:
        model_config: config.MODEL (HEAD.BATCHNORM_EPS and HEAD.BATCHNORM_MOMENTUM are read).
        in_dim: the trunk's output width.
        num_clusters: ``[K]``, the output width (DINO's ``out_dim``, e.g. 65536).
        use_bn: BatchNorm1d after each hidden Linear.
        normalize_last_layer: fix the last layer's row norms at 1.
        num_layers: Linear layers before the last layer (at least 1).
        hidden_dim: width of the hidden layers.
        bottleneck_dim: width of the L2-normalised bottleneck.
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        in_dim: int,
        num_clusters: Sequence[int] | int = DINOHeadParams.num_clusters,
        use_bn: bool = DINOHeadParams.use_bn,
        normalize_last_layer: bool = DINOHeadParams.normalize_last_layer,
        num_layers: int = DINOHeadParams.num_layers,
        hidden_dim: int = DINOHeadParams.hidden_dim,
        bottleneck_dim: int = DINOHeadParams.bottleneck_dim,
    ) -> None:
        super().__init__()
        p = parse_head(
            DINOHeadParams,
            "dino_head",
            {
                "in_dim": in_dim,
                "num_clusters": num_clusters,
                "use_bn": use_bn,
                "normalize_last_layer": normalize_last_layer,
                "num_layers": num_layers,
                "hidden_dim": hidden_dim,
                "bottleneck_dim": bottleneck_dim,
            },
        )
        in_dim, num_layers, use_bn = p.in_dim, p.num_layers, p.use_bn
        hidden_dim, bottleneck_dim = p.hidden_dim, p.bottleneck_dim
        out_dim = dino_output_dim(p.num_clusters)
        eps = float(cfg_get(model_config, "HEAD.BATCHNORM_EPS", 1e-5))
        momentum = float(cfg_get(model_config, "HEAD.BATCHNORM_MOMENTUM", 0.1))
        widths = [in_dim] + [hidden_dim] * (num_layers - 1) + [bottleneck_dim]
        layers: list[nn.Module] = []
        for i in range(num_layers):
            layers.append(nn.Linear(widths[i], widths[i + 1]))
            if i < num_layers - 1:
                if use_bn:
                    layers.append(nn.BatchNorm1d(widths[i + 1], eps=eps, momentum=momentum))
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        for module in self.mlp.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        self.prototypes0 = WeightNormLinear(
            bottleneck_dim, out_dim, learn_scale=not p.normalize_last_layer
        )
        self.in_dim = in_dim
        self.output_dim = out_dim

    def forward(self, batch: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        x = flat_head_input(batch, "dino_head")
        if x.shape[1] != self.in_dim:
            raise ConfigError(
                f"{_KEY}: dino_head's in_dim is {self.in_dim} but its input has width "
                f"{x.shape[1]} (the trunk's output); set in_dim to {x.shape[1]}.",
                _KEY,
            )
        x = F.normalize(self.mlp(x), dim=-1, p=2)
        return self.prototypes0(x)

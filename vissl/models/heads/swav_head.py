"""``swav_head``: SwAV's projection MLP followed by one or more sets of prototypes.

The projection is a stack of Linear (-> BatchNorm1d) -> ReLU layers ``dims[0] -> dims[1]
-> ... -> dims[-1]`` (no BN/ReLU after the last Linear with ``skip_last_bn``). The
embedding is L2-normalised (``normalize_feats``) and scored against each set of
prototypes, ``prototypes0``, ``prototypes1``, ...: bias-free ``nn.Linear(dims[-1], K_i)``
layers, so that ``heads.0.prototypes0.weight`` names the first set (VISSL configs freeze
it for the first iterations with ``MODEL.TEMP_FROZEN_PARAMS_ITER_MAP``).

Output, as in VISSL: ``[embedding, scores_0, scores_1, ...]`` (without the embedding when
``return_embeddings`` is False).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from vissl.config.params import IntAtLeast, Note, OneOf
from vissl.errors import ConfigError
from vissl.models.heads import parse_head, register_model_head
from vissl.models.heads.dino_head import WeightNormLinear
from vissl.models.heads.mlp import check_dims
from vissl.models.model_helpers import cfg_get, flat_head_input

_KEY = "config.MODEL.HEAD.PARAMS"


PosInt = Annotated[int, IntAtLeast(1)]
#: The activations of the projection's hidden layers.
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "ReLU": lambda: nn.ReLU(inplace=True),
    "GELU": nn.GELU,
}


@dataclass(kw_only=True, frozen=True)
class SwAVHeadParams:
    """swav_head's arguments (VISSL's defaults; ``dims`` is checked by ``check_dims``)."""

    dims: list[Any]
    use_bn: bool = True
    num_clusters: Annotated[
        PosInt | Sequence[PosInt], Note("one per set of prototypes, e.g. [3000]")
    ] = (3000,)
    use_bias: bool = True
    return_embeddings: bool = True
    skip_last_bn: bool = True
    normalize_feats: bool = True
    activation_name: Annotated[str, OneOf(*ACTIVATIONS)] = "ReLU"
    use_weight_norm_prototypes: bool = False
    normalize_last_layer: bool = False

    def check(self, key_path: str) -> None:
        if self.num_clusters == [] and not self.return_embeddings:
            raise ConfigError(
                f"{key_path}: swav_head with num_clusters=[] and return_embeddings=False "
                "would output nothing; give prototypes or return the embeddings.",
                f"{key_path}.num_clusters",
            )


@register_model_head("swav_head")
class SwAVHead(nn.Module):
    """SwAV head: projection MLP, L2 normalisation, prototype scores.

    Args:
        model_config: config.MODEL (HEAD.BATCHNORM_EPS and HEAD.BATCHNORM_MOMENTUM are read).
        dims: projection sizes, input first, e.g. ``[2048, 2048, 128]``; ``[D]`` alone
            means no projection (the embedding is the input).
        use_bn: BatchNorm1d after each hidden Linear.
        num_clusters: number of prototypes of each set, e.g. ``[3000]`` (``[]``: none).
        use_bias: the projection's Linear layers have a bias (prototypes never do).
        return_embeddings: put the (normalised) embedding first in the output.
        skip_last_bn: no BN/ReLU after the last projection layer.
        normalize_feats: L2-normalise the embedding before the prototypes.
        activation_name: the projection's activation, ``ReLU`` or ``GELU`` (VISSL's).
        use_weight_norm_prototypes: weight-normalised prototypes (VISSL's
            ``nn.utils.weight_norm`` with ``g`` at 1): ``prototypes{i}`` is a
            ``WeightNormLinear`` whose ``weight`` is the direction ``V``.
        normalize_last_layer: with weight-normalised prototypes, keep ``g`` fixed at 1
            (else it is a learnt per-prototype ``scale``).
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        dims: list[int],
        use_bn: bool = SwAVHeadParams.use_bn,
        num_clusters: Sequence[int] | int = SwAVHeadParams.num_clusters,
        use_bias: bool = SwAVHeadParams.use_bias,
        return_embeddings: bool = SwAVHeadParams.return_embeddings,
        skip_last_bn: bool = SwAVHeadParams.skip_last_bn,
        normalize_feats: bool = SwAVHeadParams.normalize_feats,
        activation_name: str = SwAVHeadParams.activation_name,
        use_weight_norm_prototypes: bool = SwAVHeadParams.use_weight_norm_prototypes,
        normalize_last_layer: bool = SwAVHeadParams.normalize_last_layer,
    ) -> None:
        super().__init__()
        dims = check_dims(dims, "swav_head", min_len=1)
        p = parse_head(
            SwAVHeadParams,
            "swav_head",
            {
                "dims": dims,
                "use_bn": use_bn,
                "num_clusters": num_clusters,
                "use_bias": use_bias,
                "return_embeddings": return_embeddings,
                "skip_last_bn": skip_last_bn,
                "normalize_feats": normalize_feats,
                "activation_name": activation_name,
                "use_weight_norm_prototypes": use_weight_norm_prototypes,
                "normalize_last_layer": normalize_last_layer,
            },
        )
        clusters = [p.num_clusters] if isinstance(p.num_clusters, int) else list(p.num_clusters)
        activations = ACTIVATIONS
        eps = float(cfg_get(model_config, "HEAD.BATCHNORM_EPS", 1e-5))
        momentum = float(cfg_get(model_config, "HEAD.BATCHNORM_MOMENTUM", 0.1))
        layers: list[nn.Module] = []
        n = len(dims) - 1
        for i in range(n):
            layers.append(nn.Linear(dims[i], dims[i + 1], bias=use_bias))
            if i == n - 1 and skip_last_bn:
                break
            if use_bn:
                layers.append(nn.BatchNorm1d(dims[i + 1], eps=eps, momentum=momentum))
            layers.append(activations[activation_name]())
        self.projection_head = nn.Sequential(*layers) if layers else nn.Identity()
        self.normalize_feats = bool(normalize_feats)
        self.return_embeddings = bool(return_embeddings)
        self.embedding_dim = dims[-1]
        self.num_clusters = clusters
        self.nmb_heads = len(clusters)
        for i, k in enumerate(clusters):
            layer: nn.Module = (
                WeightNormLinear(dims[-1], k, learn_scale=not normalize_last_layer)
                if use_weight_norm_prototypes
                else nn.Linear(dims[-1], k, bias=False)
            )
            self.add_module(f"prototypes{i}", layer)

    def prototype_layers(self) -> list[nn.Linear]:
        """The prototype layers, ``prototypes0``, ``prototypes1``, ... in order.

        With ``use_weight_norm_prototypes`` they are ``WeightNormLinear``, which has the
        same ``weight`` parameter (the direction) and the same call, so the losses treat
        both alike."""
        return [getattr(self, f"prototypes{i}") for i in range(self.nmb_heads)]

    @torch.no_grad()
    def normalize_prototypes(self) -> None:
        """L2-normalise every prototype (each row of each prototype weight), in place."""
        for layer in self.prototype_layers():
            layer.weight.copy_(F.normalize(layer.weight, dim=1, p=2))

    def forward(self, batch: torch.Tensor | Sequence[torch.Tensor]) -> list[torch.Tensor]:
        x = flat_head_input(batch, "swav_head")
        emb = self.projection_head(x)
        if self.normalize_feats:
            emb = F.normalize(emb, dim=1, p=2)
        out = [emb] if self.return_embeddings else []
        out.extend(layer(emb) for layer in self.prototype_layers())
        return out


def find_swav_heads(module: nn.Module) -> list[SwAVHead]:
    """Every :class:`SwAVHead` inside ``module`` (wrappers included), in module order."""
    return [m for m in module.modules() if isinstance(m, SwAVHead)]

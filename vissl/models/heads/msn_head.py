"""``msn_head``: MSN's projection MLP and learnable prototypes (Assran et al. 2022, *Masked
Siamese Networks for Label-Efficient Learning*), VISSL's name and arguments.

``in_dim -> hidden_dim -> hidden_dim -> output_dim``: three Linear layers (``fc.fc1``,
``fc.fc2``, ``fc.fc3``, VISSL's names), optional BatchNorm1d (``fc.bn1``, ``fc.bn2``) and GELU
after the first two. The projection ``z`` is L2-normalised and compared with the
L2-normalised prototypes ``heads.<i>.prototypes`` (``num_prototypes x output_dim``, MSN's
uniform init in ``+-1/sqrt(output_dim)``)::

    output = normalize(z) @ normalize(prototypes).T     # (N, num_prototypes), in [-1, 1]

The output is the cosine similarity to every prototype, computed in float32 also under
autocast; ``msn_loss`` divides it by its temperatures (VISSL's head applied the softmax and
its ``temperature`` itself; here the loss owns both temperatures, so the target's
sharpening stays in float32; VISSL's head keys ``temperature`` and ``label_smoothing`` are
accepted, and ``msn_loss`` checks they equal its own). With ``return_query`` the head returns ``normalize(z)``
(the representation MSN evaluates). ``freeze_prototypes`` keeps the prototypes at their
initial values (``requires_grad`` False).

The prototypes are shared by the anchor and the target branch: ``msn_loss``'s target
encoder (an EMA copy of the model) has its prototypes set to the model's before each of
its forwards, as in MSN where the target's scores use the same prototypes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from vissl.config.params import IntAtLeast, Note
from vissl.errors import ConfigError
from vissl.models.heads import parse_head, register_model_head
from vissl.models.model_helpers import cfg_get, flat_head_input

_KEY = "config.MODEL.HEAD.PARAMS"


PosInt = Annotated[int, IntAtLeast(1)]
#: VISSL's head keys whose values msn_loss applies (and checks against its own).
LossValue = Annotated[float | None, Note("VISSL's key; msn_loss applies it")]


@dataclass(kw_only=True, frozen=True)
class MSNHeadParams:
    """msn_head's arguments (see :class:`MSNHead`)."""

    in_dim: PosInt
    num_prototypes: PosInt = 1024
    use_bn: bool = False
    hidden_dim: PosInt = 2048
    output_dim: PosInt = 256
    freeze_prototypes: bool = False
    return_query: bool = False
    temperature: LossValue = None
    label_smoothing: LossValue = None


@register_model_head("msn_head")
class MSNHead(nn.Module):
    """MSN's projection head and prototypes (see the module docstring).

    Args:
        model_config: config.MODEL (HEAD.BATCHNORM_EPS and HEAD.BATCHNORM_MOMENTUM are read).
        in_dim: the trunk's output width (the class token's).
        num_prototypes: the number of prototypes ``K`` (MSN: 1024).
        use_bn: BatchNorm1d after the first two Linear layers (MSN: true).
        hidden_dim: width of the hidden layers (MSN: 2048).
        output_dim: width of the projection and of the prototypes (MSN: 256).
        freeze_prototypes: keep the prototypes at their random initialisation.
        return_query: return the normalised projection instead of the prototype scores.
        temperature: VISSL's head key; the temperatures are msn_loss's here, which checks
            that a value given here equals its ``temperature``.
        label_smoothing: VISSL's head key, likewise msn_loss's ``label_smoothing``.
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        in_dim: int,
        num_prototypes: int = MSNHeadParams.num_prototypes,
        use_bn: bool = MSNHeadParams.use_bn,
        hidden_dim: int = MSNHeadParams.hidden_dim,
        output_dim: int = MSNHeadParams.output_dim,
        freeze_prototypes: bool = MSNHeadParams.freeze_prototypes,
        return_query: bool = MSNHeadParams.return_query,
        temperature: float | None = MSNHeadParams.temperature,
        label_smoothing: float | None = MSNHeadParams.label_smoothing,
    ) -> None:
        super().__init__()
        p = parse_head(
            MSNHeadParams,
            "msn_head",
            {
                "in_dim": in_dim,
                "num_prototypes": num_prototypes,
                "use_bn": use_bn,
                "hidden_dim": hidden_dim,
                "output_dim": output_dim,
                "freeze_prototypes": freeze_prototypes,
                "return_query": return_query,
                "temperature": temperature,
                "label_smoothing": label_smoothing,
            },
        )
        self.in_dim, self.num_prototypes, self.output_dim = p.in_dim, p.num_prototypes, p.output_dim
        hidden_dim, use_bn, self.return_query = p.hidden_dim, p.use_bn, p.return_query
        eps = float(cfg_get(model_config, "HEAD.BATCHNORM_EPS", 1e-5))
        momentum = float(cfg_get(model_config, "HEAD.BATCHNORM_MOMENTUM", 0.1))
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        widths = [self.in_dim, hidden_dim, hidden_dim, self.output_dim]
        for i in range(3):
            layers[f"fc{i + 1}"] = nn.Linear(widths[i], widths[i + 1])
            if i < 2:
                if use_bn:
                    layers[f"bn{i + 1}"] = nn.BatchNorm1d(widths[i + 1], eps=eps, momentum=momentum)
                layers[f"gelu{i + 1}"] = nn.GELU()
        self.fc = nn.Sequential(layers)
        for module in self.fc.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        bound = self.output_dim**-0.5
        self.prototypes = nn.Parameter(
            torch.empty(self.num_prototypes, self.output_dim).uniform_(-bound, bound)
        )
        if p.freeze_prototypes:
            self.prototypes.requires_grad_(False)

    def query(self, batch: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """The L2-normalised projection ``(N, output_dim)``."""
        x = flat_head_input(batch, "msn_head")
        if x.shape[1] != self.in_dim:
            raise ConfigError(
                f"{_KEY}: msn_head's in_dim is {self.in_dim} but its input has width "
                f"{x.shape[1]} (the trunk's output); set in_dim to {x.shape[1]}.",
                _KEY,
            )
        z = self.fc(x)
        with torch.autocast(z.device.type, enabled=False):
            return F.normalize(z.float(), dim=-1, p=2)

    def forward(self, batch: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        query = self.query(batch)
        if self.return_query:
            return query
        # float32 under autocast: the target temperature (0.025) magnifies rounding 40x
        with torch.autocast(query.device.type, enabled=False):
            supports = F.normalize(self.prototypes.float(), dim=-1, p=2)
            return query @ supports.t()

    def extra_repr(self) -> str:
        return (
            f"num_prototypes={self.num_prototypes}, output_dim={self.output_dim}, "
            f"frozen_prototypes={not self.prototypes.requires_grad}"
        )

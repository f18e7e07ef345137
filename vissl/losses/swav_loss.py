"""``swav_loss``: SwAV's swapped prediction with online Sinkhorn-Knopp codes (Caron et al.,
"Unsupervised Learning of Visual Features by Contrasting Cluster Assignments", 2020).

For each set of prototypes and each crop ``c`` in ``crops_for_assign``, the codes
``q_c`` of the ``B`` samples are computed by Sinkhorn-Knopp on ``exp(scores_c / epsilon)``
over the global batch (all ranks, plus the queue when it is used). Every other crop ``p``
predicts them with ``softmax(scores_p / temperature)``; the loss is

    mean over prototype sets, mean over c, mean over p != c of
        -1/B sum_i sum_k q_c[i, k] log softmax(scores_p[i] / temperature)[k]

Queue (``queue.queue_length > 0``): each rank keeps the embeddings of the assign crops of
its last ``local_queue_length`` samples. Their scores by the CURRENT prototypes join the
batch scores in Sinkhorn (more samples for the equipartition at small batch sizes). The
queue is used from ``queue.start_iter`` on and only once it is full; it is per-rank state,
saved for every rank.

The model must be bound (``bind_model``, done by the trainer) for the queue to be scored.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.swav_common import SwAVLossBase, infer_swav_config, loss_kwargs

_KEY = "config.LOSS.swav_loss"


def model_prototypes(model: nn.Module, key: str) -> list[nn.Linear]:
    """The prototype layers of the swav_head inside ``model``."""
    from vissl.models.heads.swav_head import find_swav_heads

    heads = find_swav_heads(model)
    if len(heads) != 1:
        raise ConfigError(
            f"{key}: the model must have exactly one swav_head (its prototypes score the "
            f"queue); found {len(heads)}. Use MODEL.HEAD.PARAMS: [[swav_head, {{...}}]].",
            "config.MODEL.HEAD.PARAMS",
        )
    return heads[0].prototype_layers()


@register_loss("swav_loss")
class SwAVLoss(SwAVLossBase):
    """SwAV's loss; see the module docstring. Arguments as :class:`SwAVLossBase`, plus
    ``output_dir`` (VISSL's; vissl's NaN check writes to the checkpoint folder)."""

    def __init__(self, output_dir: str = "", **kwargs: Any) -> None:
        super().__init__(_KEY, **kwargs)
        self.output_dir = str(output_dir or "")
        # A plain list: the model's layers must not become part of the loss's state.
        self._prototypes: list[nn.Linear] = []

    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        infer_swav_config(params, config, "swav_loss")

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> SwAVLoss:
        return cls(output_dir=params.get("output_dir", ""), **loss_kwargs(params))

    def bind_model(self, model: nn.Module) -> None:
        """Keep a reference to the model's prototypes (they score the queue)."""
        self._prototypes = model_prototypes(model, _KEY)

    def forward(self, output: Any, target: Any = None) -> torch.Tensor:
        """SwAV loss of this rank's rows (``target`` unused)."""
        emb, head_scores = self.split_output(output)
        bs = emb.shape[0] // self.num_crops
        use_queue = self.queue.is_ready(self.iteration)
        if use_queue and not self._prototypes:
            raise RuntimeError(
                "swav_loss: the queue needs the model's prototypes; call "
                "loss.bind_model(model) first (the trainer does)."
            )
        queued = self.queue_scores(self.queue, self._prototypes, use_queue, len(head_scores))
        loss = emb.new_zeros((), dtype=torch.float32)
        for h, scores in enumerate(head_scores):
            loss = loss + self.swapped_loss(scores, scores, queued[h], bs)
        loss = loss / len(head_scores)
        if self.training:
            self.queue.push([emb[bs * c : bs * (c + 1)] for c in self.crops_for_assign])
        self.after_forward()
        return loss

    def extra_repr(self) -> str:
        return (
            f"temperature={self.temperature}, epsilon={self.epsilon}, num_iters={self.num_iters}, "
            f"crops_for_assign={self.crops_for_assign}, num_crops={self.num_crops}, "
            f"num_prototypes={self.num_prototypes}"
        )

"""``swav_momentum_loss``: SwAV whose codes come from a momentum (EMA) encoder.

The loss keeps an EMA copy of the whole model (trunk and swav_head), made by
``bind_model``. :class:`~vissl.hooks.swav_hooks.SwAVMomentumHook` runs it on the
``crops_for_assign`` crops of each batch (``on_forward``), with the model's BatchNorm
running statistics copied in, and updates it after each optimizer step (``on_update``):
``encoder = momentum * encoder + (1 - momentum) * model``; from
``momentum_eval_mode_iter_start`` on it runs in eval mode (VISSL's
``swav_momentum_hooks.py``).

For each set of prototypes and each crop ``c`` of ``crops_for_assign``, the codes are
Sinkhorn-Knopp (over the global batch, as in ``swav_loss``) of the MOMENTUM encoder's
scores of crop ``c`` (block ``j`` of its rows for ``c = crops_for_assign[j]``); every other crop of the model predicts them, with the same
cross entropy and averaging as ``swav_loss``. The optional queue keeps the momentum
encoder's embeddings of the assign crops, scored by its current prototypes; it is used
from ``queue.start_iter`` on, once full. Prototypes are normalised in both models
(``normalize_last_layer``).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.losses import register_loss
from vissl.losses.swav_common import (
    SwAVLossBase,
    check_non_negative_int,
    infer_swav_config,
    loss_kwargs,
)
from vissl.losses.swav_loss import model_prototypes

_KEY = "config.LOSS.swav_momentum_loss"


@register_loss("swav_momentum_loss")
class SwAVMomentumLoss(SwAVLossBase):
    """SwAV with codes from a momentum encoder.

    Args:
        momentum: EMA factor of the momentum encoder, in [0, 1].
        momentum_eval_mode_iter_start: the momentum encoder runs in eval mode from this
            iteration on.
        **kwargs: as :class:`~vissl.losses.swav_common.SwAVLossBase`.
    """

    def __init__(
        self, momentum: float = 0.99, momentum_eval_mode_iter_start: int = 0, **kwargs: Any
    ) -> None:
        super().__init__(_KEY, **kwargs)
        if isinstance(momentum, bool) or not isinstance(momentum, int | float):
            raise ConfigError(
                f"{_KEY}.momentum must be a number in [0, 1], got {momentum!r}.", f"{_KEY}.momentum"
            )
        if not 0.0 <= float(momentum) <= 1.0:
            raise ConfigError(
                f"{_KEY}.momentum must be in [0, 1], got {momentum!r}.", f"{_KEY}.momentum"
            )
        self.momentum = float(momentum)
        self.momentum_eval_mode_iter_start = check_non_negative_int(
            momentum_eval_mode_iter_start, f"{_KEY}.momentum_eval_mode_iter_start"
        )
        self.momentum_encoder: nn.Module | None = None
        #: The momentum encoder's output for the current batch (set by SwAVMomentumHook).
        self.momentum_output: Any = None
        self._momentum_prototypes: list[nn.Linear] = []

    @classmethod
    def infer_config(cls, params: MutableMapping[str, Any], config: Mapping[str, Any]) -> None:
        infer_swav_config(params, config, "swav_momentum_loss")

    @classmethod
    def from_config(cls, params: Mapping[str, Any]) -> SwAVMomentumLoss:
        return cls(
            momentum=params.get("momentum", 0.99),
            momentum_eval_mode_iter_start=params.get("momentum_eval_mode_iter_start", 0),
            **loss_kwargs(params),
        )

    def bind_model(self, model: nn.Module) -> None:
        """Make the momentum encoder: a frozen copy of ``model`` (part of the loss's state)."""
        from vissl.models.momentum import momentum_copy

        model_prototypes(model, _KEY)  # exactly one swav_head
        self.momentum_encoder = momentum_copy(model)
        self._momentum_prototypes = model_prototypes(self.momentum_encoder, _KEY)

    def required_hooks(self) -> list[Any]:
        from vissl.hooks.swav_hooks import SwAVMomentumHook

        return [*super().required_hooks(), SwAVMomentumHook()]

    def split_momentum_output(self, output: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``(embedding, [scores_0, ...])`` of the momentum encoder's output (its rows: the
        ``crops_for_assign`` crops, which need not be ``num_crops`` crops)."""
        if isinstance(output, torch.Tensor) or len(output) != len(self.num_prototypes) + 1:
            raise ValueError(
                "swav_momentum_loss expects the momentum encoder's swav_head output "
                f"[embedding, scores_0, ...] with {len(self.num_prototypes)} set(s) of scores."
            )
        outputs = list(output)
        return outputs[0], outputs[1:]

    def forward(self, output: Any, target: Any = None) -> torch.Tensor:
        """Loss of this rank's rows; the codes come from ``self.momentum_output``, the
        momentum encoder's output on the ``crops_for_assign`` crops (in that order)."""
        emb, head_scores = self.split_output(output)
        if self.momentum_output is None:
            raise RuntimeError(
                "swav_momentum_loss: no momentum encoder output for this batch. The "
                "SwAVMomentumHook (declared in required_hooks) sets it on_forward; when "
                "calling the loss by hand, set loss.momentum_output first."
            )
        m_emb, m_scores = self.split_momentum_output(self.momentum_output)
        self.momentum_output = None
        bs = emb.shape[0] // self.num_crops
        assign = len(self.crops_for_assign)
        if m_emb.shape[0] != assign * bs:
            raise ValueError(
                f"swav_momentum_loss: the momentum encoder gave {m_emb.shape[0]} rows; it runs "
                f"on the {assign} crops_for_assign crops of the {bs} samples ({assign * bs} "
                "rows, in crops_for_assign order)."
            )
        use_queue = self.queue.is_ready(self.iteration)
        if use_queue and not self._momentum_prototypes:
            raise RuntimeError("swav_momentum_loss: call loss.bind_model(model) first.")
        queued = self.queue_scores(
            self.queue, self._momentum_prototypes, use_queue, len(head_scores)
        )
        blocks = range(assign)  # the encoder's rows: crops_for_assign[j] in block j
        loss = emb.new_zeros((), dtype=torch.float32)
        for h, (scores, code_scores) in enumerate(zip(head_scores, m_scores, strict=True)):
            loss = loss + self.swapped_loss(
                scores, code_scores.detach(), queued[h], bs, code_blocks=blocks
            )
        loss = loss / len(head_scores)
        if self.training:
            self.queue.push([m_emb[bs * j : bs * (j + 1)] for j in blocks])
        self.after_forward()
        return loss

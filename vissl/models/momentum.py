"""Momentum (EMA) copies of a model: MoCo's key encoder, SwAV's momentum encoder, teachers.

The copy is made once, from the model the task built (before it is wrapped in DDP or
compiled), holds no gradients and is never given to the optimizer. Its parameters follow
the model's by an exponential moving average::

    target = momentum * target + (1 - momentum) * source

Buffers (BatchNorm running statistics) are not averaged: the copy's own forward passes
in train mode update them, as in MoCo.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["ema_update_", "momentum_copy"]


def _plain(model: nn.Module) -> nn.Module:
    """``model`` without DDP / ``torch.compile`` wrappers."""
    seen = 0
    while seen < 4:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
        seen += 1
    return model


def momentum_copy(model: nn.Module) -> nn.Module:
    """A frozen deep copy of ``model`` (no gradients), on the same device, in train mode."""
    target = copy.deepcopy(_plain(model))
    for param in target.parameters():
        param.requires_grad_(False)
    return target


@torch.no_grad()
def ema_update_(target: nn.Module, source: nn.Module, momentum: float) -> None:
    """``target.p = momentum * target.p + (1 - momentum) * source.p`` for every parameter.

    Args:
        target: the momentum copy (from :func:`momentum_copy`).
        source: the model being trained (wrappers are seen through).
        momentum: in [0, 1]; 1 keeps ``target``, 0 copies ``source``.

    Raises:
        ValueError: the two models do not have the same parameters.
    """
    source = _plain(source)
    target_params = dict(target.named_parameters())
    source_params = dict(source.named_parameters())
    if target_params.keys() != source_params.keys():
        missing = sorted(source_params.keys() ^ target_params.keys())[:5]
        raise ValueError(
            f"the momentum copy and the model differ in their parameters (e.g. {missing}); "
            "the copy must be made from the model it follows."
        )
    names = list(source_params)
    dst = [target_params[n].data for n in names]
    src = [source_params[n].detach().to(dtype=target_params[n].dtype) for n in names]
    if dst:
        torch._foreach_lerp_(dst, src, 1.0 - float(momentum))

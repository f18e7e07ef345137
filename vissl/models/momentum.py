"""Momentum (EMA) copies of a model: MoCo's key encoder, SwAV's momentum encoder, teachers.

The copy is made once, from the model the task built (before it is wrapped in DDP or
compiled), holds no gradients and is never given to the optimizer. Its parameters follow
the model's by an exponential moving average::

    target = momentum * target + (1 - momentum) * source

Buffers (BatchNorm running statistics) are not averaged: the copy's own forward passes
in train mode update them, as in MoCo. A copy that never runs in train mode (the
``HOOKS.EMA_MODEL`` average) copies them from the model instead
(:func:`ema_update_tensors_`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "EmaTensors",
    "copy_tensors_",
    "ema_tensors",
    "ema_update_",
    "ema_update_tensors_",
    "momentum_copy",
]


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


@dataclass(frozen=True)
class EmaTensors:
    """The tensors of a momentum copy and of the model it follows, matched by name.

    Gathered once (:func:`ema_tensors`) so that each update is one foreach call, with no
    per-step name lookups. Valid while the model's parameters and buffers are updated in
    place (optimizer steps, ``load_state_dict``), which is how the trainer changes them.
    """

    target_params: list[torch.Tensor]
    source_params: list[torch.Tensor]
    target_buffers: list[torch.Tensor]
    source_buffers: list[torch.Tensor]


def _matched(
    target: dict[str, torch.Tensor], source: dict[str, torch.Tensor], what: str
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    if target.keys() != source.keys():
        differ = sorted(source.keys() ^ target.keys())[:5]
        raise ValueError(
            f"the momentum copy and the model differ in their {what} (e.g. {differ}); "
            "the copy must be made from the model it follows."
        )
    bad = [n for n in source if source[n].shape != target[n].shape][:5]
    if bad:
        raise ValueError(f"the momentum copy and the model differ in the shape of {bad}.")
    names = list(source)
    return [target[n] for n in names], [source[n] for n in names]


def ema_tensors(target: nn.Module, source: nn.Module) -> EmaTensors:
    """Pair ``target``'s parameters and buffers with ``source``'s (wrappers are seen through).

    Raises:
        ValueError: the two models do not have the same parameter and buffer names/shapes.
    """
    source = _plain(source)
    tp, sp = _matched(
        {n: p.data for n, p in target.named_parameters()},
        {n: p for n, p in source.named_parameters()},
        "parameters",
    )
    tb, sb = _matched(dict(target.named_buffers()), dict(source.named_buffers()), "buffers")
    return EmaTensors(tp, sp, tb, sb)


@torch.no_grad()
def ema_update_tensors_(tensors: EmaTensors, momentum: float, copy_buffers: bool = True) -> None:
    """``target = momentum * target + (1 - momentum) * source`` for the paired parameters.

    Buffers (BatchNorm running statistics, counters) are copied from the source when
    ``copy_buffers`` is set. On one device and dtype this is one foreach lerp (and one
    foreach copy) with no other allocation; a target on another device (e.g. an EMA kept
    on the CPU) first copies the source's tensors there.

    Args:
        tensors: from :func:`ema_tensors`.
        momentum: in [0, 1]; 1 keeps the target, 0 copies the source.
        copy_buffers: also copy the buffers.
    """
    dst = tensors.target_params
    src = [
        s if s.device == d.device and s.dtype == d.dtype else s.to(device=d.device, dtype=d.dtype)
        for d, s in zip(dst, tensors.source_params, strict=True)
    ]
    if dst:
        torch._foreach_lerp_(dst, src, 1.0 - float(momentum))
    if copy_buffers:
        copy_tensors_(tensors.target_buffers, tensors.source_buffers)


@torch.no_grad()
def copy_tensors_(target: list[torch.Tensor], source: list[torch.Tensor]) -> None:
    """``t.copy_(s)`` for each pair (one foreach call when every pair shares a device)."""
    if not target:
        return
    if all(t.device == s.device for t, s in zip(target, source, strict=True)):
        torch._foreach_copy_(target, source)
    else:
        for t, s in zip(target, source, strict=True):
            t.copy_(s)

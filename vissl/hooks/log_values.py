"""The numbers a log iteration reads from the device: read once per step, in one go.

On a log iteration several hooks want the last step's loss and the entries of
``task.additional_log_data`` (e.g. ``loss.<k>`` of a dict loss) as Python numbers:
``CheckNanLossHook`` (with its own finiteness sum), ``LogLossLrEtaHook`` and
``TensorboardHook``. Each ``.item()`` makes the host wait for the device, so
:func:`read_log_values` stacks every one-element tensor and reads them with a single
``tolist()`` per device, and keeps the result on ``task.last_batch`` for the other hooks
of the same step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

_CACHE = "log_values"  # the attribute of task.last_batch that keeps what was read


def _items(task: SelfSupervisionTask) -> list[tuple[str, Any]]:
    last = task.last_batch
    loss = last.loss if last is not None else None
    extras = getattr(task, "additional_log_data", None) or {}
    return [("loss", loss), *extras.items()]


def _version(value: Any) -> int:
    """A tensor's in-place change counter (-1 for anything else)."""
    return int(value._version) if isinstance(value, torch.Tensor) else -1


def _key(items: list[tuple[str, Any]]) -> list[tuple[str, Any, int]]:
    """What the kept values were read from: each entry's object and its version."""
    return [(k, v, _version(v)) for k, v in items]


def _same(a: list[tuple[str, Any, int]], b: list[tuple[str, Any]]) -> bool:
    return len(a) == len(b) and all(
        x[0] == y[0] and x[1] is y[1] and x[2] == _version(y[1]) for x, y in zip(a, b)
    )


def _read(tensors: list[torch.Tensor]) -> list[float]:
    """The values of one-element tensors, one device read per device."""
    out: list[float] = [0.0] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    with torch.no_grad():
        for indices in by_device.values():
            parts = [tensors[i].detach().reshape(()).float() for i in indices]
            values = parts[0].reshape(1) if len(parts) == 1 else torch.stack(parts)
            for i, v in zip(indices, values.tolist()):
                out[i] = float(v)
    return out


def read_log_values(
    task: SelfSupervisionTask, *also: torch.Tensor
) -> tuple[dict[str, Any], list[float]]:
    """The last step's ``loss`` and ``task.additional_log_data`` as Python values.

    One-element tensors become floats (a missing loss is NaN), other tensors lists, other
    values stay as they are. The first call of a step reads the device once per device
    the tensors live on, together with the one-element tensors ``also`` (whose values are
    returned second and not kept); later calls in the same step reuse what was read (kept
    on ``task.last_batch`` while the loss and the entries are the same objects, not
    changed in place).
    """
    items = _items(task)
    last = task.last_batch
    cached = getattr(last, _CACHE, None) if last is not None else None
    fresh = cached is None or not _same(cached[0], items)
    scalars: list[torch.Tensor] = (
        [] if not fresh else [v for _, v in items if isinstance(v, torch.Tensor) and v.numel() == 1]
    )
    read = _read([*scalars, *also]) if scalars or also else []
    if cached is not None and not fresh:
        return dict(cached[1]), read
    values = iter(read[: len(scalars)])
    out: dict[str, Any] = {}
    for key, value in items:
        if isinstance(value, torch.Tensor):
            out[key] = next(values) if value.numel() == 1 else value.tolist()
        elif value is None and key == "loss":
            out[key] = float("nan")
        else:
            out[key] = value
    if last is not None:
        try:
            setattr(last, _CACHE, (_key(items), out))
        except AttributeError:  # a custom step's last_batch without room for it: no cache
            pass
    return dict(out), read[len(scalars) :]

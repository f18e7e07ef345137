"""Hyper-parameters: a config flattened to scalars, and TensorBoard's HPARAMS view.

``flatten_hparams({"OPTIMIZER": {"name": "sgd", "num_epochs": 2}, "METERS": {"names": ["a"]}})``
gives ``{"OPTIMIZER.name": "sgd", "OPTIMIZER.num_epochs": 2, "METERS.names": '["a"]'}``:
numbers, booleans and strings stay as they are, lists (and anything else) become strings,
``None`` becomes ``"None"``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

HParam = bool | int | float | str


def _scalar(value: Any) -> HParam:
    if isinstance(value, bool | int | float | str):
        return value
    if value is None:
        return "None"
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        return float(value.item())
    try:
        return json.dumps(value, default=str, sort_keys=False)
    except (TypeError, ValueError):
        return str(value)


def flatten_hparams(tree: Mapping[str, Any], prefix: str = "", sep: str = ".") -> dict[str, HParam]:
    """``tree`` flattened to ``{"A.B.C": scalar or string}`` (see the module docstring).

    An empty mapping gives one entry, ``"{}"``, so that the key still shows.
    """
    out: dict[str, HParam] = {}
    for key, value in tree.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            if value:
                out.update(flatten_hparams(value, name, sep))
            else:
                out[name] = "{}"
        else:
            out[name] = _scalar(value)
    return out


def write_hparams(
    writer: Any, hparams: Mapping[str, HParam], metrics: Mapping[str, float], step: int = 0
) -> None:
    """Write ``hparams`` and ``metrics`` to TensorBoard's HPARAMS view, in ``writer``'s run.

    ``SummaryWriter.add_hparams`` would open a sub-run folder (``<logdir>/<timestamp>``);
    this writes the same three hparams summaries into the writer's own event file, and
    each metric as a scalar of that tag at ``step``.

    Args:
        writer: a ``torch.utils.tensorboard.SummaryWriter``.
        hparams: name -> bool, int, float or str.
        metrics: tag -> value; the tags should not be used by other scalars of the run.
    """
    from torch.utils.tensorboard.summary import hparams as hparams_summary

    exp, ssi, sei = hparams_summary(dict(hparams), dict(metrics))
    file_writer = writer._get_file_writer()  # the writer's own event file (no public API)
    for summary in (exp, ssi, sei):
        file_writer.add_summary(summary, step)
    for tag, value in metrics.items():
        writer.add_scalar(tag, value, step)
    writer.flush()


__all__ = ["HParam", "flatten_hparams", "write_hparams"]

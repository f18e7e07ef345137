"""``update_meters``: feed a batch to meters, without the rows a sampler padded."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def update_meters(
    meters: Iterable[Any], output: Any, target: Any, valid: Any, drop_padding: bool = True
) -> None:
    """``meter.update(output, target)`` for each meter, minding ``valid`` (``data_valid``).

    ``valid`` is 0 for the repeats a ``DistributedSampler`` pads each rank's share with.
    Meters with ``supports_valid_mask`` get it as ``valid=`` (no host sync). With
    ``drop_padding`` (TEST phases) the other meters get the padding rows removed (boolean
    indexing: one host sync); without it (train phases, as in VISSL) they see every row.
    A ``valid`` that does not line up with the output's and target's rows is ignored.
    """
    outputs = [output] if isinstance(output, torch.Tensor) else output
    if not (
        isinstance(valid, torch.Tensor)
        and isinstance(target, torch.Tensor)
        and valid.ndim == 1
        and valid.shape[0] == target.shape[0]
        and isinstance(outputs, list | tuple)
        and all(
            isinstance(o, torch.Tensor) and o.ndim >= 1 and o.shape[0] == valid.shape[0]
            for o in outputs
        )
    ):
        valid = None  # no per-row flags that line up with the outputs
    keep = None
    for meter in meters:
        if valid is None:
            meter.update(output, target)
        elif getattr(meter, "supports_valid_mask", False):
            meter.update(output, target, valid=valid)
        elif not drop_padding:
            meter.update(output, target)
        else:
            if keep is None:
                keep = valid != 0
            if isinstance(output, torch.Tensor):
                meter.update(output[keep], target[keep])
            else:
                meter.update([o[keep] for o in outputs], target[keep])

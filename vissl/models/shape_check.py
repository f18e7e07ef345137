"""Check, when the model is built, that every head takes the width it is given.

A head whose first ``dims`` entry does not match the trunk's output width would otherwise
fail deep in the first forward pass with torch's ``mat1 and mat2 shapes cannot be
multiplied``. :func:`check_head_input_widths` runs the trunk and the heads once on the
``meta`` device (shapes only: no memory, no arithmetic, the real parameters untouched) and
turns a mismatch into a :class:`~vissl.errors.ConfigError` naming the head's key path and
both widths.

The check is skipped (at debug level) where it cannot be exact: a trunk whose output width
depends on the input size (a flattened feature map), or a module that cannot run on the
meta device.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.nn as nn
from torch.func import functional_call
from torch.nn.modules.batchnorm import _BatchNorm

from vissl.errors import ConfigError

logger = logging.getLogger(__name__)

HEAD_KEY = "config.MODEL.HEAD.PARAMS"
#: the probe's input size, and a second one: a trunk whose output width differs between
#: them is size-dependent, and then a mismatch found at the first is not reported
PROBE_SIZES = (160, 224)


class _Mismatch(Exception):
    """A head that cannot take its input: the user's error, or the head's own."""

    def __init__(self, message: str, error: ConfigError | None = None) -> None:
        super().__init__(message)
        self.error = error or ConfigError(message, HEAD_KEY)


def _mismatch(where: str, name: str, x: torch.Tensor, expected: int, source: str) -> _Mismatch:
    width = _width(x)
    shape = f" (shape {tuple(x.shape[1:])})" if x.dim() > 2 else ""
    return _Mismatch(
        f"{HEAD_KEY}{where}: head {name!r} takes inputs of width {expected} but {source} "
        f"has width {width}{shape}: set the head's input width (its first `dims` "
        f"entry) to {width}."
    )


class _CannotProbe(Exception):
    pass


def _on_meta(module: nn.Module, *args: object) -> object:
    """``module(*args)`` with meta copies of its parameters and buffers."""
    state = {
        name: torch.empty_like(t, device="meta")
        for name, t in [*module.named_parameters(), *module.named_buffers()]
    }
    try:
        return functional_call(module, state, args, tie_weights=True, strict=False)
    except ConfigError as err:  # a module's own clear error about its input (eval_mlp's)
        raise _Mismatch(str(err), err) from None
    except Exception as err:  # any failure on meta ends the probe
        raise _CannotProbe(str(err)) from err


def _width(t: torch.Tensor) -> int:
    return int(t[0].numel()) if t.dim() > 1 else 1


def expected_input_width(head: nn.Module) -> int | None:
    """The input width of a head: its first Linear's or BatchNorm's, in definition order."""
    for m in head.modules():
        if isinstance(m, nn.Linear):
            return int(m.in_features)
        if isinstance(m, _BatchNorm):
            return int(m.num_features)
    return None


def _trunk_features(trunk: nn.Module, feature_names: list[str], size: int) -> list[torch.Tensor]:
    channels = next((m.in_channels for m in trunk.modules() if isinstance(m, nn.Conv2d)), 3)
    try:
        x = torch.empty(2, channels, size, size, device="meta")
        out = _on_meta(trunk, x, feature_names or None)
    except _Mismatch as err:  # the trunk refuses the probe's size: not the user's mistake
        raise _CannotProbe(str(err)) from None
    feats = [out] if isinstance(out, torch.Tensor) else list(out)  # type: ignore[call-overload]
    if not all(isinstance(f, torch.Tensor) for f in feats):
        raise _CannotProbe("the trunk does not return tensors")
    return feats


def _apply(head: nn.Module, x: object, where: str, name: str, source: str) -> object:
    if not isinstance(x, torch.Tensor):
        raise _CannotProbe(f"the input of head {where} is not a tensor")
    try:
        out = _on_meta(head, x)
    except _CannotProbe:
        expected = expected_input_width(head)
        if expected is None or expected in (_width(x), x.shape[1] if x.dim() > 1 else 1):
            raise  # a failure that is not about the width: the forward pass reports it
        raise _mismatch(where, name, x, expected, source) from None
    return out


def check_head_input_widths(
    trunk: nn.Module,
    feature_names: list[str],
    heads: Sequence[nn.Module] | nn.ModuleList,
    head_names: Sequence[Sequence[str]],
    parallel: bool,
) -> None:
    """Raise a ConfigError if a head cannot take the width the trunk (or the head before it
    in a chain) gives it. Heads are applied as ``multi_input_output_model`` applies them.

    Args:
        trunk: the trunk; it is called as ``trunk(x, feature_names or None)``.
        feature_names: the trunk features the model asks for.
        heads: the model's heads (``nn.Sequential`` chains when ``parallel``).
        head_names: per head, the registry name of each module in its chain.
        parallel: HEAD.PARAMS uses the list-of-chains form.

    Raises:
        ConfigError: a head's input width differs from the width it is given.
    """
    if len(heads) == 0:
        return
    try:
        with torch.no_grad():
            large = _trunk_features(trunk, feature_names, PROBE_SIZES[1])
            try:
                _run_heads(large, heads, head_names, parallel)
            except _Mismatch:
                small = _trunk_features(trunk, feature_names, PROBE_SIZES[0])
                if [_width(f) for f in small] != [_width(f) for f in large]:
                    raise _CannotProbe(
                        "the trunk's output width depends on the input size"
                    ) from None
                raise
    except _CannotProbe as err:
        logger.debug("head width check skipped: %s", err)
    except _Mismatch as err:
        raise err.error from None


def _run_heads(
    feats: list[torch.Tensor],
    heads: Sequence[nn.Module] | nn.ModuleList,
    names: Sequence[Sequence[str]],
    parallel: bool,
) -> None:
    if len(feats) == len(heads):
        pairs = [(feats[i], i) for i in range(len(heads))]
        sources = [
            "the trunk's output" if len(feats) == 1 else f"trunk feature {i}"
            for i in range(len(feats))
        ]
    elif len(feats) == 1:
        pairs = [(feats[0], i) for i in range(len(heads))]
        sources = ["the trunk's output"] * len(heads)
    else:
        return  # the forward pass reports this mismatch of counts
    if not parallel and len(feats) == 1 and len(heads) > 1:  # one chain of flat entries
        out: object = feats[0]
        source = "the trunk's output"
        for i, head in enumerate(heads):
            out = _apply(head, out, f"[{i}]", names[i][0], source)
            source = f"the output of {HEAD_KEY}[{i}] ({names[i][0]})"
        return
    for (feat, i), source in zip(pairs, sources):
        head = heads[i]
        chain = list(head.children()) if parallel and isinstance(head, nn.Sequential) else [head]
        x: object = feat
        for j, module in enumerate(chain):
            where = f"[{i}][{j}]" if parallel else f"[{i}]"
            x = _apply(module, x, where, names[i][j], source)
            source = f"the output of {HEAD_KEY}{where} ({names[i][j]})"

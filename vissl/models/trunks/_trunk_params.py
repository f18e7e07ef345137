"""Shared pieces of VISSL's named trunks: reading a ``MODEL.TRUNK.<FAMILY>`` block with
typed errors naming the key path, resolving feature names, importing timm.

Private (not imported by the trunk registry's auto-import): the trunks import it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Annotated, Any, TypeVar

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from vissl.config.params import IntAtLeast, Note, OneOf, UnitOpen, parse
from vissl.errors import ConfigError
from vissl.models.model_helpers import cfg_get

#: Where evaluation names the trunk features it wants.
FEATURES_KEY = "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP"
_CHECKPOINT_KEY = "ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING"


P = TypeVar("P")

#: An integer >= 1.
PosInt = Annotated[int, IntAtLeast(1)]
#: A probability in [0, 1) (a dropout or drop-path rate; 0 turns it off).
Rate = Annotated[float, UnitOpen, Note("a probability; 0 turns it off")]
#: VISSL's QK_SCALE where timm's attention is used: only False (or null) is supported.
NoQKScale = Annotated[
    bool | None,
    OneOf(False, None),
    Note(
        "this trunk's attention (timm's) always scales by 1/sqrt(head dim), the value of "
        "QK_SCALE: False; a custom scale is not supported"
    ),
]


def parse_trunk(params_cls: type[P], model_config: Mapping[str, Any] | None, family: str) -> P:
    """``config.MODEL.TRUNK.<family>`` read into the trunk's parameter dataclass
    (:func:`vissl.config.params.parse`: unknown keys, types and ranges, with key paths)."""
    block = cfg_get(model_config, f"TRUNK.{family}", None)
    return parse(params_cls, block, f"config.MODEL.TRUNK.{family}")


def trunk_error(family: str, name: str, value: Any, why: str) -> ConfigError:
    """A ConfigError for ``MODEL.TRUNK.<family>.<name>``: its path, its value and ``why``
    (the rules that tie several keys together)."""
    path = f"config.MODEL.TRUNK.{family}.{name}"
    return ConfigError(f"{path}={value!r}: {why}", path)


def import_timm(trunk: str) -> ModuleType:
    """The ``timm`` module, or a ConfigError naming MODEL.TRUNK.NAME when it is missing."""
    try:
        return importlib.import_module("timm")
    except ImportError as err:
        raise ConfigError(
            f"config.MODEL.TRUNK.NAME={trunk} is built on the timm library, which is not "
            f"installed ({err}); install it with `pip install timm` (or `pip install "
            "vissl[timm]`).",
            "config.MODEL.TRUNK.NAME",
        ) from err


def resolve_features(
    out_feat_keys: Sequence[str] | None,
    available: Sequence[str],
    default: str,
    trunk: str,
    aliases: Mapping[str, str] | None = None,
) -> list[str]:
    """The requested feature names (aliases replaced), ``[default]`` when none is asked for.

    Raises:
        ConfigError: a name the trunk does not have (names LINEAR_EVAL_FEAT_POOL_OPS_MAP).
    """
    alias = dict(aliases or {})
    names = [alias.get(n, n) for n in (list(out_feat_keys) if out_feat_keys else [default])]
    unknown = [n for n in names if n not in available]
    if unknown:
        shown = list(available) + [f"{a} (= {t})" for a, t in alias.items()]
        raise ConfigError(
            f"the {trunk} trunk has no feature named {unknown[0]!r}; its features are "
            f"{shown}. Fix the names in {FEATURES_KEY}.",
            FEATURES_KEY,
        )
    return names


def checkpointing_on(model_config: Mapping[str, Any] | None) -> bool:
    """MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING."""
    return bool(cfg_get(model_config, _CHECKPOINT_KEY, False))


def maybe_checkpoint(
    fn: Callable[..., torch.Tensor], enabled: bool, owner: nn.Module, *args: Any
) -> torch.Tensor:
    """``fn(*args)``, with its activations recomputed in the backward pass when
    ``enabled`` and ``owner`` trains with gradients."""
    if enabled and owner.training and torch.is_grad_enabled():
        out = checkpoint(fn, *args, use_reentrant=False)
        assert isinstance(out, torch.Tensor)
        return out
    return fn(*args)


def tokens_to_map(tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(N, h*w, D) patch tokens -> an (N, D, h, w) map."""
    n, _, dim = tokens.shape
    return tokens.transpose(1, 2).reshape(n, dim, *grid)

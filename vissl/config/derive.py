"""The config stage's derive step: what components infer from the rest of the config.

Some values of a component's block follow from other parts of the config: a loss's
crops from the transforms, its embedding width from the head, its queue length from the
batch size. They are computed here once, when the config is validated
(:func:`vissl.utils.hydra_config.convert_to_attrdict`), and written into the config
before it is frozen and saved, so that ``train_config.yaml`` holds the values the
components are built from and nothing writes into the config afterwards.

A loss class declares its inference as a classmethod ``derive(params, config) ->
mapping`` that returns a new block (pure), or as the older in-place
``infer_config(params, config)``, which runs here on a copy. Registries are looked up by
name (:func:`vissl.utils.registry.get_registry`): config/ does not import the component
packages.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.utils.registry import get_registry

__all__ = ["derive_params", "derived_config", "derived_loss_config", "infer_loss_config"]

logger = logging.getLogger(__name__)


def _plain(block: Mapping[str, Any]) -> dict[str, Any]:
    return block.to_dict() if isinstance(block, AttrDict) else copy.deepcopy(dict(block))


def derive_params(
    cls: Any, params: Mapping[str, Any], config: Mapping[str, Any] | None
) -> AttrDict:
    """``LOSS.<name>`` with what the loss class infers from the rest of ``config`` (crops
    from the transforms, prototypes from the head, queue lengths from the batch size), as
    a new mapping: neither argument is changed.

    A class declares the inference as ``derive(params, config) -> mapping`` (pure), or
    as the older in-place ``infer_config(params, config)``, which runs here on a copy.
    Deriving is idempotent: a block that is already derived comes back equal.
    """
    block = _plain(params)
    if config is None:
        return AttrDict(block)
    derive = getattr(cls, "derive", None)
    if callable(derive):
        return AttrDict(_plain(derive(AttrDict(block), config)))
    infer_config = getattr(cls, "infer_config", None)
    if callable(infer_config):
        copied = AttrDict(block)
        infer_config(copied, config)
        return copied
    return AttrDict(block)


def derived_loss_config(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{name: block}``: the selected loss's block with what it infers from the rest of
    ``config`` (see :func:`derive_params`), or None when there is nothing to derive (no
    loss, a ``torch.nn`` loss, a typo: the build reports those)."""
    loss_config = config.get("LOSS")
    losses = get_registry("loss")
    if not isinstance(loss_config, Mapping) or losses is None:
        return None
    name = loss_config.get("name")
    if not isinstance(name, str) or name not in losses:
        return None
    cls = losses.get(name)
    if not callable(getattr(cls, "derive", None)) and not callable(
        getattr(cls, "infer_config", None)
    ):
        return None
    params = loss_config.get(name)
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise ConfigError(
            f"config.LOSS.{name} must be a mapping of the loss parameters, got {params!r}.",
            f"config.LOSS.{name}",
        )
    return {name: derive_params(cls, params, config).to_dict()}


def infer_loss_config(config: MutableMapping[str, Any]) -> None:
    """Write into ``config`` what the selected loss infers from the rest of it
    (:func:`derived_loss_config`). The config stage calls it once, before the config is
    frozen and saved (``train_config.yaml`` then holds what the loss is built from); the
    run folder's checks call it on copies. Nothing calls it on a config in use.
    """
    derived = derived_loss_config(config)
    for name, block in (derived or {}).items():
        config["LOSS"][name] = block  # AttrDict's __setitem__ wraps nested mappings


def derived_config(cfg: Mapping[str, Any]) -> AttrDict:
    """A copy of ``cfg`` (the ``config`` section) with what the loss infers written in,
    as the config stage writes it: for a config that did not go through that stage (a
    test's, one read back from an old checkpoint). Idempotent. A loss that cannot infer
    (a config error) leaves the copy as it is: building the loss then fails on that error
    where it always did."""
    plain = cfg.to_dict() if isinstance(cfg, AttrDict) else copy.deepcopy(dict(cfg))
    out = AttrDict(plain)
    try:
        infer_loss_config(out)
    except Exception as err:
        logger.debug("the loss's inference failed on a copy of the config: %s", err)
    return out

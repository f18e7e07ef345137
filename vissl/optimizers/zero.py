"""``OPTIMIZER.use_zero``: the optimizer state sharded over the ranks (ZeRO stage 1) with
``torch.distributed.optim.ZeroRedundancyOptimizer``, VISSL's ``zero`` optimizer.

Each rank keeps the state (momentum, Adam's moments) of its share of the parameters,
steps them, and broadcasts them to the others; gradients are still all-reduced by DDP.
The param groups (learning rate, weight decay per group, set by the schedules) are those
of the optimizer ``OPTIMIZER.name`` builds, and ZeRO's ``param_groups`` are the global
ones, so the schedules and checkpoints see the same groups as without ZeRO.

Checkpoints hold the consolidated state in torch's layout (:func:`zero_state_dict`,
collective), so a run with ZeRO resumes one without it and the other way round.
Under ``self_supervision_fsdp_task`` FSDP already shards the optimizer state: the key
has nothing to add there.

VISSL's ``TRAINER.TASK_NAME: self_supervision_sdp_task`` (fairscale's ShardedDDP with the
OSS optimizer, which VISSL ran with ``use_zero`` only) and ``MODEL.SHARDED_DDP_SETUP.USE_SDP``
(which selects that task) map to this: DDP with the optimizer state sharded. The other
``SHARDED_DDP_SETUP`` keys have no meaning here (:func:`sharded_ddp_notes`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

import torch

from vissl.errors import ConfigError
from vissl.optimizers.larc import LARC

logger = logging.getLogger(__name__)

#: ``TRAINER.TASK_NAME`` of VISSL's ShardedDDP task: DDP with ZeRO here.
SDP_TASK_NAME = "self_supervision_sdp_task"

_SDP_KEY = "config.MODEL.SHARDED_DDP_SETUP"
#: ``MODEL.SHARDED_DDP_SETUP`` keys other than ``USE_SDP``: (neutral value, what it maps to).
SHARDED_DDP_ONLY_KEYS: dict[str, tuple[Any, str]] = {
    "reduce_buffer_size": (
        -1,
        "no meaning: fairscale batched small gradients before reducing each to its owner; "
        "DDP all-reduces gradients in DATA.DDP_BUCKET_CAP_MB buckets (set that instead)",
    ),
}


def is_sdp_task(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` (the ``config`` section) selects VISSL's ShardedDDP task."""
    return str(config["TRAINER"]["TASK_NAME"]) == SDP_TASK_NAME


def sharded_ddp_notes(setup: Mapping[str, Any] | None) -> list[str]:
    """One line per ``MODEL.SHARDED_DDP_SETUP`` key set away from its neutral value."""
    notes = []
    for key, (neutral, meaning) in SHARDED_DDP_ONLY_KEYS.items():
        if setup and key in setup and setup[key] != neutral:
            notes.append(f"{_SDP_KEY}.{key}={setup[key]!r}: {meaning}.")
    return notes


def is_zero(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a ``ZeroRedundancyOptimizer``."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


def wrap_zero(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """A ``ZeroRedundancyOptimizer`` with ``optimizer``'s class, defaults and param groups
    (collective: every rank builds it with the same groups).

    Raises:
        ConfigError: with LARC (``OPTIMIZER.use_larc``), whose wrapper ZeRO cannot build.
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(optimizer, LARC):
        raise ConfigError(
            "config.OPTIMIZER.use_zero with config.OPTIMIZER.use_larc is not supported: "
            "ZeRO builds the optimizer class itself on each rank's share. Use the FSDP task "
            "(TRAINER.TASK_NAME: self_supervision_fsdp_task), which shards LARC's state, or "
            "turn one of the two off.",
            "config.OPTIMIZER.use_zero",
        )
    groups = [dict(g) for g in optimizer.param_groups]
    defaults: Mapping[str, Any] = optimizer.defaults
    first, *rest = groups
    # defaults the constructor takes (AdamW's holds decoupled_weight_decay, which it sets)
    accepted = inspect.signature(type(optimizer).__init__).parameters
    zero = ZeroRedundancyOptimizer(
        first.pop("params"),
        optimizer_class=type(optimizer),
        **{k: v for k, v in defaults.items() if k != "params" and k in accepted},
    )
    # the first group's own settings (ZeRO built it from the defaults), then the others
    zero.param_groups[0].update(first)
    for group in rest:
        zero.add_param_group(group)
    # the local optimizer's groups follow the global ones at every step (ZeRO syncs them)
    logger.info(
        "OPTIMIZER.use_zero: %s state sharded over the ranks (ZeroRedundancyOptimizer)",
        type(optimizer).__name__,
    )
    return zero


def zero_state_dict(optimizer: Any, is_primary: bool) -> dict[str, Any]:
    """The consolidated state of a ZeRO optimizer on the primary rank, ``{}`` elsewhere
    (collective: every rank must call it)."""
    optimizer.consolidate_state_dict(to=0)
    return optimizer.state_dict() if is_primary else {}  # type: ignore[no-any-return]

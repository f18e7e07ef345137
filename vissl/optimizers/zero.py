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

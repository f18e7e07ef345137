"""The ``train`` engine: set up this process, build hooks, run the trainer."""

from __future__ import annotations

import copy
import logging
import random
from typing import Any

import numpy as np
import torch

from vissl.config.attr_dict import AttrDict
from vissl.engines import Engine, register_engine
from vissl.engines.run_context import HookGenerator, RunContext
from vissl.trainer.trainer_main import SelfSupervisionTrainer
from vissl.utils.distributed import broadcast_object, get_rank
from vissl.utils.env import get_device
from vissl.utils.logger import setup_logging, shutdown_logging

logger = logging.getLogger(__name__)


def set_seeds(cfg: Any, rank: int) -> None:
    """Seed python, numpy and torch with SEED_VALUE + rank (as VISSL)."""
    seed = int(cfg.SEED_VALUE) + rank
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def train_main(
    ctx: RunContext | Any,
    dist_run_id: str | None = None,
    checkpoint_path: str | None = None,
    checkpoint_folder: str | None = None,
    local_rank: int = 0,
    node_id: int = 0,
    hook_generator: HookGenerator | None = None,
) -> Any:
    """Train in this process (the process group, if any, is already initialised).

    Takes a :class:`RunContext`, or VISSL's arguments ``(cfg, dist_run_id,
    checkpoint_path, checkpoint_folder, local_rank, node_id, hook_generator)`` so that a
    VISSL engine calling ``train_main`` keeps working.
    """
    if not isinstance(ctx, RunContext):
        if checkpoint_folder is None:
            raise TypeError("train_main(cfg, ...) needs checkpoint_folder, as in VISSL")
        from vissl.hooks import default_hook_generator

        ctx = RunContext(
            cfg=ctx,
            engine_name="train",
            run_id=str(dist_run_id),
            checkpoint_folder=checkpoint_folder,
            hook_generator=hook_generator or default_hook_generator,
            checkpoint_path=checkpoint_path,
            local_rank=local_rank,
            node_id=node_id,
        )
    cfg, checkpoint_folder = ctx.cfg, ctx.checkpoint_folder
    rank = get_rank()
    # Hooks read CHECKPOINT.DIR: make it the folder this run really uses (it differs with
    # APPEND_DISTR_RUN_ID), on a copy so the caller's config is untouched.
    cfg = AttrDict(copy.deepcopy(cfg.to_dict()))
    cfg.CHECKPOINT.DIR = checkpoint_folder
    # Rank 0's launcher made the resume choice (the other nodes' launchers did not).
    chosen = broadcast_object(ctx.checkpoint_path)
    checkpoint_path = str(chosen) if chosen else None
    # A resume writes nothing into the folder (log.txt, train_config.yaml) before its
    # checkpoint is known to fit: the trainer starts the log file then.
    setup_logging(
        checkpoint_folder, rank, verbose=bool(cfg.VERBOSE), defer_file=bool(checkpoint_path)
    )
    try:
        device = get_device(cfg, ctx.local_rank)
        set_seeds(cfg, rank)
        hooks = ctx.hook_generator(cfg)
        trainer = SelfSupervisionTrainer(
            cfg,
            checkpoint_folder,
            device,
            hooks,
            checkpoint_path,
        )
        return trainer.train()
    finally:
        shutdown_logging()


@register_engine("train")
class TrainEngine(Engine):
    """Self-supervised or supervised training with optional test phases."""

    def run_engine(self, ctx: RunContext) -> Any:
        return train_main(ctx)

"""Data: datasets, data sources, transforms, collators and data loaders.

``build_dataset(cfg, "TRAIN")`` builds a :class:`GenericSSLDataset` from
``cfg.DATA.TRAIN``; ``get_loader(dataset, cfg, "TRAIN", num_replicas=..., rank=...,
seed=..., device_is_cuda=...)`` wraps it in a ``DataLoader`` with a
``DistributedSampler``, the configured collator and reproducibly seeded workers.
The transforms before ``ToTensor`` run on tensors by default (the same random crops,
about twice as fast; see :mod:`vissl.data.ssl_transforms.tensor_path` and
docs/data_pipeline.md).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import random
import signal
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from vissl.config.attr_dict import AttrDict
from vissl.data.collators import COLLATOR_REGISTRY, get_collator, register_collator
from vissl.data.data_helper import split_cfg_value
from vissl.data.data_sources import DATA_SOURCE_REGISTRY, get_data_source, register_data_source
from vissl.data.samplers import SampleKey, StatefulDistributedSampler
from vissl.data.ssl_dataset import GenericSSLDataset
from vissl.data.ssl_transforms import (
    TRANSFORM_REGISTRY,
    build_transforms,
    get_transform,
    register_transform,
)
from vissl.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "COLLATOR_REGISTRY",
    "DATA_SOURCE_REGISTRY",
    "TRANSFORM_REGISTRY",
    "GenericSSLDataset",
    "SampleKey",
    "StatefulDistributedSampler",
    "build_collate_fn",
    "build_dataset",
    "build_transforms",
    "get_collator",
    "get_data_source",
    "get_loader",
    "get_transform",
    "register_collator",
    "register_data_source",
    "register_transform",
    "seed_worker",
]

MULTI_PROCESSING_METHODS = ("fork", "forkserver", "spawn")


def build_dataset(cfg: AttrDict, split: str) -> GenericSSLDataset:
    """Build the dataset of ``split`` from ``cfg.DATA.<split>``.

    Args:
        cfg: the full config.
        split: ``"TRAIN"`` or ``"TEST"``.

    Raises:
        ConfigError: invalid data settings, naming the key path.
    """
    return GenericSSLDataset(cfg, split)


def build_collate_fn(cfg: AttrDict, split: str) -> Any:
    """The collate function of ``COLLATE_FUNCTION`` bound to ``COLLATE_FUNCTION_PARAMS``.

    Raises:
        UnknownNameError: an unknown collator name.
        ConfigError: parameters the collator does not accept, or values its
            ``check_params(params, key_path=...)`` attribute, if any, rejects.
    """
    split_cfg = cfg["DATA"][split]
    name = split_cfg_value(split_cfg, "COLLATE_FUNCTION", "default_collate")
    params = dict(split_cfg_value(split_cfg, "COLLATE_FUNCTION_PARAMS", {}) or {})
    fn = get_collator(name)
    if not params:
        return fn
    key = f"config.DATA.{split}.COLLATE_FUNCTION_PARAMS"
    try:
        inspect.signature(fn).bind([], **params)
    except TypeError as err:
        raise ConfigError(
            f"{key}: collator {name!r} does not accept {params}: {err}.", key
        ) from err
    except ValueError:
        pass  # no signature available (builtins): let the call decide
    check = getattr(fn, "check_params", None)
    if callable(check):
        # a collator that checks its values here fails at build, naming the key, rather
        # than in a data loader worker at the first batch
        check(params, key_path=key)
    return functools.partial(fn, **params)


def _worker_seed(seed: int, rank: int, worker_id: int) -> int:
    sequence = np.random.SeedSequence([seed % 2**32, rank, worker_id])
    return int(sequence.generate_state(1, dtype=np.uint64)[0] % 2**63)


def seed_worker(worker_id: int, *, seed: int, rank: int) -> None:
    """Seed python, numpy and torch in a data loader worker from (seed, rank, worker_id).

    Used as ``worker_init_fn``: random augmentations are then the same in every run
    with the same seed, rank and number of workers. It also moves the worker into a process
    group of its own and ignores SIGINT there: a terminal's Ctrl-C and a SIGTERM sent to the
    whole process group (`timeout`, `kill -- -PGID`, SLURM's scancel) then reach the
    trainer only, which handles them (a checkpoint, then exit 130 or 75) and shuts the
    workers down; a worker killed by the signal would fail the next batch instead. SIGTERM
    is not ignored: the loader's own ``terminate()`` of a worker must still end it.
    """
    try:
        os.setpgid(0, 0)
    except OSError:  # not permitted here (e.g. a session leader): keep the parent's group
        pass
    for name in ("SIGINT", "SIGTTOU"):  # SIGTTOU: a background group may still print
        signum = getattr(signal, name, None)  # neither exists on Windows
        if signum is not None:
            signal.signal(signum, signal.SIG_IGN)
    worker_seed = _worker_seed(seed, rank, worker_id)
    random.seed(worker_seed)
    np.random.seed(worker_seed % 2**32)
    torch.manual_seed(worker_seed)


def get_loader(
    dataset: GenericSSLDataset,
    cfg: AttrDict,
    split: str,
    *,
    num_replicas: int,
    rank: int,
    seed: int,
    device_is_cuda: bool,
) -> DataLoader[Any]:
    """Build the data loader of ``split``.

    The sampler is a ``DistributedSampler`` over ``num_replicas`` ranks (shuffled with
    ``seed`` for TRAIN, in order for TEST); call ``loader.sampler.set_epoch(phase)``
    each phase. Batches of ``BATCHSIZE_PER_REPLICA`` are collated by
    ``COLLATE_FUNCTION``; ``DROP_LAST`` drops the last partial batch. With workers
    (``DATA.NUM_DATALOADER_WORKERS`` > 0) they are persistent, started with
    ``MULTI_PROCESSING_METHOD`` and seeded from (seed, rank, worker id).

    Args:
        dataset: the dataset (usually from :func:`build_dataset`).
        cfg: the full config.
        split: ``"TRAIN"`` or ``"TEST"``.
        num_replicas: number of data-parallel ranks.
        rank: this rank.
        seed: the run's seed (``SEED_VALUE``).
        device_is_cuda: whether batches go to a CUDA device (enables ``PIN_MEMORY``).

    Raises:
        ConfigError: invalid loader settings, naming the key path.
    """
    data_cfg = cfg["DATA"]
    split_cfg = data_cfg[split]
    batch_size = split_cfg_value(split_cfg, "BATCHSIZE_PER_REPLICA", 1)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        key = f"config.DATA.{split}.BATCHSIZE_PER_REPLICA"
        raise ConfigError(f"{key}={batch_size!r} must be a positive integer.", key)
    num_workers = split_cfg_value(data_cfg, "NUM_DATALOADER_WORKERS", 0)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        key = "config.DATA.NUM_DATALOADER_WORKERS"
        raise ConfigError(f"{key}={num_workers!r} must be an integer >= 0.", key)
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank} is not in [0, {num_replicas})")

    if split_cfg_value(split_cfg, "USE_DEBUGGING_SAMPLER", False):
        logger.warning(
            "config.DATA.%s.USE_DEBUGGING_SAMPLER is not supported yet; using the stateful "
            "distributed sampler.",
            split,
        )
    # Always stateful (USE_STATEFUL_DISTRIBUTED_SAMPLER is implied): the order comes from
    # (seed, epoch), a resumed run can start mid-epoch, and augmentations are seeded per
    # sample from (seed, epoch, index).
    sampler = StatefulDistributedSampler(
        dataset,
        num_replicas=num_replicas,
        rank=rank,
        shuffle=split == "TRAIN",
        seed=seed,
        batch_size=batch_size,
    )
    loader_kwargs: dict[str, Any] = {}
    if num_workers > 0:
        method = cfg.get("MULTI_PROCESSING_METHOD", "forkserver")
        if method not in MULTI_PROCESSING_METHODS:
            key = "config.MULTI_PROCESSING_METHOD"
            raise ConfigError(
                f"{key}={method!r} is unknown; use one of {list(MULTI_PROCESSING_METHODS)}.",
                key,
            )
        context = torch.multiprocessing.get_context(method)
        if method == "forkserver":
            # Workers fork from a server that has imported torch and vissl.data once,
            # instead of each importing them (seconds per worker). Only effective
            # before the server starts; "__main__" is the standard preload.
            context.set_forkserver_preload(["__main__", "vissl.data"])
        loader_kwargs.update(
            multiprocessing_context=context,
            persistent_workers=True,
            worker_init_fn=functools.partial(seed_worker, seed=seed, rank=rank),
        )
    generator = torch.Generator()
    generator.manual_seed(_worker_seed(seed, rank, 2**31))
    pin_memory = bool(split_cfg_value(data_cfg, "PIN_MEMORY", False)) and device_is_cuda
    loader: DataLoader[Any] = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=build_collate_fn(cfg, split),
        pin_memory=pin_memory,
        drop_last=bool(split_cfg_value(split_cfg, "DROP_LAST", False)),
        generator=generator,
        **loader_kwargs,
    )
    logger.info(
        "%s loader: %d samples, rank %d/%d, batch %d, %d workers, %d batches",
        split,
        len(dataset),
        rank,
        num_replicas,
        batch_size,
        num_workers,
        len(loader),
    )
    return loader

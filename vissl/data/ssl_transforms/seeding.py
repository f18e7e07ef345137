"""Seeding the global RNGs for one sample's augmentations.

Below both :mod:`vissl.data.ssl_dataset` (which seeds each sample from (seed, epoch,
index)) and :mod:`vissl.data.ssl_transforms.device_path` (which runs the workers' chain
once to count the views); ``vissl.data.ssl_dataset.seeded_rng`` re-exports it.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch


@contextlib.contextmanager
def seeded_rng(seed: int) -> Iterator[None]:
    """Seed python, numpy and torch (CPU) RNGs for a block, then restore their states.

    In a data loader worker the global RNGs serve nothing else, so they are only seeded.
    Only torch's CPU generator is seeded (``torch.manual_seed`` would also queue the
    seeding of every accelerator's generators, about 1 ms per call, and transforms draw
    on the CPU).
    """
    if torch.utils.data.get_worker_info() is not None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.default_generator.manual_seed(seed)
        yield
        return
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.default_generator.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)

"""A stateful, deterministic distributed sampler for exact mid-epoch resume.

``StatefulDistributedSampler`` orders samples from ``(seed, epoch)`` exactly as torch's
``DistributedSampler`` does, and can start ``start_iter`` batches into the epoch, so a
resumed run sees exactly the batches an uninterrupted run would have seen.

It yields :class:`SampleKey` ``(index, epoch, padding)`` rather than bare indices; the
dataset seeds each sample's augmentations from ``(seed, epoch, index)``. Augmentations are
therefore the same with 0 or N data loader workers, across processes and across resumes.

Like torch's sampler it pads the index list with repeats so that every rank gets the same
number of samples; those repeats carry ``padding=True`` and the dataset marks them with
``data_valid`` 0 (:data:`PADDING_DATA_VALID`), so meters do not count them twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
from torch.utils.data import DistributedSampler

#: ``data_valid`` of a sample that only pads a rank's share (1: valid, -1: unreadable).
PADDING_DATA_VALID = 0


class SampleKey(NamedTuple):
    """What the sampler yields: a dataset index, the epoch it is drawn in, and whether it
    is a repeat that only pads this rank's share of the data."""

    idx: int
    epoch: int
    padding: bool = False


def sample_seed(base_seed: int, epoch: int, index: int) -> int:
    """The augmentation seed of one sample: a hash of (base seed, epoch, index)."""
    return int(
        np.random.SeedSequence([int(base_seed), int(epoch), int(index)]).generate_state(1)[0]
    )


#: the first entropy word of a batch seed, so it never equals a sample's (``sample_seed``)
_BATCH_STREAM = 0x62617463


def batch_seed(base_seed: int, keys: Sequence[Any]) -> int | None:
    """The seed of a batch's own random draws (e.g. ``cutmixup_collator``'s mixing).

    A hash of (base seed, epoch, the batch's indices in order), so it is the same with any
    number of data loader workers and after a resume. None when ``keys`` are bare indices
    (no epoch is known).
    """
    if not keys or not all(isinstance(k, tuple) and len(k) >= 2 for k in keys):
        return None
    entropy = [_BATCH_STREAM, int(base_seed), int(keys[0][1]), *(int(k[0]) for k in keys)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


class SeededSamples(list):  # type: ignore[type-arg]
    """The samples of one batch (a plain list to every collator) with ``seed``, the seed of
    the batch's own random draws (:func:`batch_seed`)."""

    def __init__(self, samples: Iterable[Any], seed: int) -> None:
        super().__init__(samples)
        self.seed = int(seed)


class StatefulDistributedSampler(DistributedSampler):  # type: ignore[type-arg]
    """``DistributedSampler`` that can resume mid-epoch and tags samples with the epoch.

    Args:
        dataset: the dataset to sample.
        num_replicas: number of ranks.
        rank: this rank.
        shuffle: shuffle with ``(seed, epoch)`` (train) or keep order (test).
        seed: the run's seed.
        batch_size: per-rank batch size, used to turn a start iteration into an offset.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int,
        rank: int,
        shuffle: bool,
        seed: int,
        batch_size: int,
        drop_last: bool = False,
    ) -> None:
        super().__init__(
            dataset,
            num_replicas=num_replicas,
            rank=rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self.batch_size = int(batch_size)
        self.start_iter = 0

    def set_start_iter(self, start_iter: int) -> None:
        """Skip the first ``start_iter`` batches of this rank in the current epoch."""
        if start_iter < 0:
            raise ValueError(f"start_iter must be >= 0, got {start_iter}")
        self.start_iter = int(start_iter)

    def __iter__(self) -> Iterator[SampleKey]:  # type: ignore[override]
        indices = list(super().__iter__())
        start = self.start_iter * self.batch_size
        # One use only: the next epoch starts at its beginning.
        self.start_iter = 0
        epoch = int(self.epoch)
        # This rank's j-th index sits at position rank + j * num_replicas of the padded
        # list; positions past the data set are the repeats added as padding.
        size = len(self.dataset)  # type: ignore[arg-type]
        return iter(
            [
                SampleKey(int(i), epoch, self.rank + j * self.num_replicas >= size)
                for j, i in enumerate(indices)
                if j >= start
            ]
        )

    def __len__(self) -> int:
        return max(0, self.num_samples - self.start_iter * self.batch_size)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": int(self.epoch), "start_iter": int(self.start_iter)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.set_epoch(int(state["epoch"]))
        self.set_start_iter(int(state["start_iter"]))

"""The data of the extraction engines: every sample of a split, once, in index order.

``extract_features``, ``extract_label_predictions`` and ``extract_cluster`` read TRAIN and
TEST the same way: the split's data set and collator, this rank's share of it without
shuffling (a ``StatefulDistributedSampler``, so ranks hold consecutive index blocks and
pad the last one), each batch reshaped by VISSL's sample rule and moved to the device.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from vissl.data.batch import construct_sample_for_model, move_to_device

__all__ = ["EvalBatches", "split_has_data"]


def split_has_data(cfg: Any, split: str) -> bool:
    """Whether ``config.DATA.<split>`` names any data (sources or catalog names)."""
    data = cfg.DATA[split]
    return bool(data.DATA_SOURCES) or bool(data.DATASET_NAMES)


class _SampleKeys:
    """What :func:`construct_sample_for_model` reads of a task: the input/target keys."""

    def __init__(self, cfg: Any, split: str) -> None:
        self.data_and_label_keys = {
            "input": list(cfg.DATA[split].INPUT_KEY_NAMES),
            "target": list(cfg.DATA[split].TARGET_KEY_NAMES),
        }


class EvalBatches:
    """This rank's share of ``split``, batch by batch, in index order.

    Iterating yields ``(sample, batch)``: ``sample`` is ``{"input", "target",
    "data_valid", ...}`` on ``device``; ``batch`` is the collated batch as the loader gave
    it (``batch["data_idx"][0]`` holds the indices). ``dataset`` is the split's data set.
    """

    def __init__(self, cfg: Any, split: str, device: torch.device) -> None:
        from vissl.data import build_collate_fn, build_dataset
        from vissl.data.samplers import StatefulDistributedSampler
        from vissl.utils.distributed import get_rank, get_world_size

        self.device = device
        self.dataset = build_dataset(cfg, split)
        batch_size = int(cfg.DATA[split].BATCHSIZE_PER_REPLICA)
        sampler = StatefulDistributedSampler(
            self.dataset,
            num_replicas=get_world_size(),
            rank=get_rank(),
            shuffle=False,
            seed=int(cfg.SEED_VALUE),
            batch_size=batch_size,
        )
        self.loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=build_collate_fn(cfg, split),
            num_workers=int(cfg.DATA.NUM_DATALOADER_WORKERS),
        )
        self.keys = _SampleKeys(cfg, split)

    def __iter__(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        for batch in self.loader:
            sample = move_to_device(construct_sample_for_model(batch, self.keys), self.device)
            yield sample, batch

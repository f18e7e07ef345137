"""A small in-memory training run for unit tests of the loop and its hooks.

No launcher and no subprocess: the config is composed and validated, then
:class:`~vissl.trainer.trainer_main.SelfSupervisionTrainer` runs in the test's process on
the CPU. The default run is a supervised ResNet-18 (a quarter of the width, 16 px digits)
with 2 epochs of 4 optimizer steps (32 samples, batch 8), each followed by a test phase of
2 batches (16 samples, batch 8): phases train, test, train, test; 8 iterations in all.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

from vissl.config.attr_dict import AttrDict
from vissl.hooks import VisslHook
from vissl.hooks.base import HOOK_EVENTS
from vissl.trainer.task import SelfSupervisionTask
from vissl.trainer.trainer_main import SelfSupervisionTrainer
from vissl.utils.hydra_config import hydra_compose_and_validate

TINY = "test/cpu_test/tiny_supervised"
TRAIN_STEPS_PER_PHASE = 4
TEST_STEPS_PER_PHASE = 2
SMALL = [
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
    "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 10]}]]",
    "config.DATA.TRAIN.DATA_LIMIT=32",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
    "config.DATA.TEST.DATA_LIMIT=16",
    "config.DATA.TEST.BATCHSIZE_PER_REPLICA=8",
    "config.LOG_FREQUENCY=2",
    "config.OPTIMIZER.num_epochs=2",
]


def tiny_config(folder: Any, *overrides: str, name: str = TINY) -> AttrDict:
    """The validated ``config`` section of the tiny run, writing to ``folder``."""
    _, cfg = hydra_compose_and_validate(
        [f"config={name}", *SMALL, f"config.CHECKPOINT.DIR={folder}", *overrides]
    )
    return cfg


def train_in_process(
    cfg: AttrDict, hooks: Iterable[Any] = (), checkpoint_path: str | None = None
) -> SelfSupervisionTask:
    """Train ``cfg`` in this process with exactly ``hooks`` (none by default)."""
    folder = str(cfg.CHECKPOINT.DIR)
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(int(cfg.SEED_VALUE))
    trainer = SelfSupervisionTrainer(
        cfg, folder, torch.device("cpu"), list(hooks), checkpoint_path=checkpoint_path
    )
    # A model this small runs fastest on one thread, and the test machine is shared.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return trainer.train()
    finally:
        torch.set_num_threads(threads)


class EventRecorder(VisslHook):
    """Records every event with the counters the task shows at that moment.

    ``records`` holds ``(event, phase_idx, train, iteration, local_iteration_num)``.
    """

    def __init__(self) -> None:
        self.records: list[tuple[str, int, bool, int, int]] = []

    def _record(self, event: str, task: SelfSupervisionTask) -> None:
        self.records.append(
            (event, task.phase_idx, bool(task.train), task.iteration, task.local_iteration_num)
        )

    def events(self) -> list[str]:
        return [r[0] for r in self.records]

    def at(self, event: str) -> list[tuple[str, int, bool, int, int]]:
        return [r for r in self.records if r[0] == event]


def _make_recorder_method(event: str) -> Any:
    def method(self: EventRecorder, task: SelfSupervisionTask) -> None:
        self._record(event, task)

    method.__name__ = event
    return method


for _event in HOOK_EVENTS:
    setattr(EventRecorder, _event, _make_recorder_method(_event))

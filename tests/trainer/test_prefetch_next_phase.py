"""The next phase's data iterator starts when this phase's data ends: with loader workers,
the next phase's first batches are made while this phase's end (checkpoints, phase-end
hooks) runs, and the batches are the same as without it."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from tests.integration._runs import read_jsonl, run_config
from vissl.data.ssl_dataset import GenericSSLDataset
from vissl.hooks import VisslHook, default_hook_generator
from vissl.hooks.base import Priority
from vissl.trainer.trainer_main import SelfSupervisionTrainer

TINY = "test/cpu_test/tiny_simclr"
WORKERS = ("config.DATA.NUM_DATALOADER_WORKERS=1", "config.MULTI_PROCESSING_METHOD=fork")


def mark_epochs(monkeypatch: pytest.MonkeyPatch, folder: str) -> None:
    """Each sample read (in a forked worker) leaves a file ``epoch<k>`` in ``folder``."""
    original = GenericSSLDataset.__getitem__

    def getitem(self: Any, key: Any) -> Any:
        epoch = getattr(key, "epoch", None)
        if epoch is not None:
            open(os.path.join(folder, f"epoch{epoch}"), "a").close()
        return original(self, key)

    monkeypatch.setattr(GenericSSLDataset, "__getitem__", getitem)


class WaitForNextPhaseData(VisslHook):
    """At phase end (after every other hook): wait up to ``timeout`` s for a worker to
    read a sample of the next phase; record whether one did."""

    priority = Priority.LOWEST + 10

    def __init__(self, folder: str, timeout: float) -> None:
        self.folder, self.timeout = folder, timeout
        self.seen: list[bool] = []

    def on_phase_end(self, task: Any) -> None:
        if task.phase_idx + 1 == len(task.phases):
            return
        marker = os.path.join(self.folder, f"epoch{task.phase_idx + 1}")
        deadline = time.monotonic() + self.timeout
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.seen.append(os.path.exists(marker))


def run(tmp_path: Any, name: str, hooks: list[Any], *overrides: str) -> list[dict[str, Any]]:
    folder = tmp_path / name
    run_config(
        TINY,
        *WORKERS,
        "config.OPTIMIZER.num_epochs=3",
        "config.LOG_FREQUENCY=1",
        f"config.CHECKPOINT.DIR={folder}",
        *overrides,
        hook_generator=lambda cfg: [*default_hook_generator(cfg), *hooks],
    )
    return read_jsonl(str(folder / "stdout.json"))


def test_the_next_phase_is_read_while_this_phase_ends(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    mark_epochs(monkeypatch, str(markers))
    waiter = WaitForNextPhaseData(str(markers), timeout=20.0)
    run(tmp_path, "prefetch", [waiter])
    # during each phase end, a worker already read the next phase's samples
    assert waiter.seen == [True, True]


def spy_prefetch(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What each call of ``_prefetch_next_phase`` left started (None: nothing)."""
    started: list[Any] = []
    original = SelfSupervisionTrainer._prefetch_next_phase

    def spy(self: Any, task: Any) -> None:
        original(self, task)
        started.append(self._prefetched)

    monkeypatch.setattr(SelfSupervisionTrainer, "_prefetch_next_phase", spy)
    return started


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.slow
def test_only_loader_workers_get_the_next_phase_started(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    started = spy_prefetch(monkeypatch)
    run(tmp_path, f"w{workers}", [], f"config.DATA.NUM_DATALOADER_WORKERS={workers}")
    # phase ends 0, 1 and 2 (the last: nothing after it)
    assert len(started) == 3 and started[2] is None
    if workers:
        assert [p[0] for p in started[:2]] == [1, 2]
    else:  # iter() without workers runs nothing ahead: not started
        assert started[:2] == [None, None]


@pytest.mark.slow
def test_a_next_phase_that_cannot_start_early_starts_after_the_phase_end(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Starting the iterator ahead fails (say, workers cannot fork): a warning, the
    phase's checkpoint is still written, and the next phase starts its data as before."""
    import vissl.trainer.trainer_main as trainer_main

    original = trainer_main._set_epoch
    failed: list[int] = []

    def failing_once(loader: Any, epoch: int) -> None:
        if epoch == 1 and not failed:  # the prefetch at the end of phase 0
            failed.append(epoch)
            raise OSError("Cannot allocate memory")
        original(loader, epoch)

    monkeypatch.setattr(trainer_main, "_set_epoch", failing_once)
    records = run(tmp_path, "failing", [])
    assert failed == [1] and len(records) == 12  # every step of the three epochs ran
    assert (tmp_path / "failing" / "model_phase0.torch").exists()
    log = (tmp_path / "failing" / "log.txt").read_text()
    assert "could not start phase 1's data ahead (Cannot allocate memory)" in log


@pytest.mark.slow
def test_the_batches_are_the_same_as_without_prefetching(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_prefetch = run(tmp_path, "with", [])
    monkeypatch.setattr(SelfSupervisionTrainer, "_prefetch_next_phase", lambda self, task: None)
    without = run(tmp_path, "without", [])
    assert len(with_prefetch) == len(without) == 12
    assert [r["loss"] for r in with_prefetch] == [r["loss"] for r in without]

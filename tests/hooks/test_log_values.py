"""A log iteration reads the device once: the NaN check, the log line and TensorBoard
share one read of the loss and its extras (``vissl.hooks.log_values``)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from tests.integration._runs import read_jsonl, run_config
from vissl.hooks import VisslHook, default_hook_generator
from vissl.hooks.base import Priority
from vissl.hooks.log_values import read_log_values
from vissl.losses import LOSS_REGISTRY, register_loss
from vissl.losses.simclr_info_nce_loss import SimclrInfoNCELoss
from vissl.trainer.train_steps.standard_train_step import LastBatchInfo

TINY = "test/cpu_test/tiny_simclr"
READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")


def count_reads(monkeypatch: pytest.MonkeyPatch, state: dict[str, Any]) -> list[tuple[int, str]]:
    """Every tensor read to the host while ``state["on"]``, with ``state["iteration"]``."""
    reads: list[tuple[int, str]] = []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapper(self: torch.Tensor, *a: Any, _o: Any = original, _n: str = name, **k: Any):
            if state["on"]:
                reads.append((state["iteration"], _n))
            return _o(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    return reads


class OnStepGate(VisslHook):
    """Counts only what the ``on_step`` hooks read: on first, off last."""

    def __init__(self, state: dict[str, Any], on: bool) -> None:
        self.state, self.on = state, on
        self.priority = Priority.HIGHEST - 1 if on else Priority.LOWEST + 1

    def on_step(self, task: Any) -> None:
        self.state["on"] = self.on
        self.state["iteration"] = task.iteration


@pytest.mark.slow
def test_one_device_read_per_log_iteration_for_all_log_hooks(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    @register_loss("test_log_values_dict")
    class DictSimclr(nn.Module):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__()
            self.inner = SimclrInfoNCELoss(temperature=0.1)

        def forward(self, output: Any, target: Any) -> dict[str, torch.Tensor]:
            loss = self.inner(output, target)
            return {"loss": loss, "half": loss.detach() / 2, "third": loss.detach() / 3}

    state: dict[str, Any] = {"on": False, "iteration": -1}
    reads = count_reads(monkeypatch, state)
    try:
        run_config(
            TINY,
            "config.LOSS.name=test_log_values_dict",
            "config.LOG_FREQUENCY=2",
            "config.OPTIMIZER.num_epochs=2",
            "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=True",
            f"config.CHECKPOINT.DIR={tmp_path}",
            hook_generator=lambda cfg: [
                OnStepGate(state, True),
                *default_hook_generator(cfg),
                OnStepGate(state, False),
            ],
        )
    finally:
        LOSS_REGISTRY.unregister("test_log_values_dict")
    records = read_jsonl(str(tmp_path / "stdout.json"))
    logged = [r["iteration"] for r in records]
    assert logged == [1, 2, 4, 6, 8]
    # the NaN check, the log line (loss and two extras) and TensorBoard (the same three):
    # seven numbers, one read per log iteration, none on the other steps
    assert reads == [(i, "tolist") for i in logged]
    for r in records:
        assert r["loss.half"] == pytest.approx(r["loss"] / 2, rel=1e-6)
        assert r["loss.third"] == pytest.approx(r["loss"] / 3, rel=1e-6)
    assert list(tmp_path.rglob("events.out.tfevents.*"))  # TensorBoard did log


def task_with(loss: Any, **extras: Any) -> Any:
    last = LastBatchInfo()
    last.loss = loss
    return SimpleNamespace(last_batch=last, additional_log_data=dict(extras))


def test_values_are_read_once_and_kept_for_the_step() -> None:
    task = task_with(torch.tensor(2.5), **{"loss.a": torch.tensor([0.25]), "n": 3})
    values, also = read_log_values(task, torch.tensor(7.0, dtype=torch.float64))
    assert values == {"loss": 2.5, "loss.a": 0.25, "n": 3} and also == [7.0]
    kept = task.last_batch.log_values
    values["loss"] = -1.0  # a caller's changes do not reach the kept values
    again, also = read_log_values(task)
    assert again == {"loss": 2.5, "loss.a": 0.25, "n": 3} and also == []
    assert task.last_batch.log_values is kept
    # a new entry (or a new loss) is a new step's values: read again
    task.additional_log_data["loss.b"] = torch.tensor(1.5)
    assert read_log_values(task)[0]["loss.b"] == 1.5
    task.last_batch.loss = torch.tensor(4.0)
    assert read_log_values(task)[0]["loss"] == 4.0


def test_missing_loss_non_scalars_and_a_last_batch_without_room() -> None:
    task = task_with(None, vec=torch.tensor([1.0, 2.0]))
    values = read_log_values(task)[0]
    assert math.isnan(values["loss"]) and values["vec"] == [1.0, 2.0]

    class Slotted:  # a custom train step's last batch: no attribute to keep values in
        __slots__ = ("loss",)

    task = SimpleNamespace(last_batch=Slotted(), additional_log_data={})
    task.last_batch.loss = torch.tensor(1.0)
    assert read_log_values(task)[0] == {"loss": 1.0}
    task = SimpleNamespace(last_batch=None, additional_log_data={})
    values, also = read_log_values(task, torch.tensor(3.0))
    assert math.isnan(values["loss"]) and also == [3.0]


def test_a_value_changed_in_place_is_read_again() -> None:
    task = task_with(torch.tensor(1.0))
    assert read_log_values(task)[0]["loss"] == 1.0
    task.last_batch.loss.mul_(3)  # a hook rescales the loss in place after the read
    assert read_log_values(task)[0]["loss"] == 3.0

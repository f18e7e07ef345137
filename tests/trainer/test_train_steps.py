"""Train steps: registration, lookup, section order, dict losses, no per-step host reads."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.integration._runs import read_jsonl, run_config
from vissl.errors import UnknownNameError
from vissl.hooks import VisslHook
from vissl.hooks.base import HOOK_EVENTS
from vissl.losses import LOSS_REGISTRY, register_loss
from vissl.losses.simclr_info_nce_loss import SimclrInfoNCELoss
from vissl.trainer.train_steps import TRAIN_STEP_REGISTRY, get_train_step, register_train_step
from vissl.trainer.train_steps.standard_train_step import StandardTrainStep

TINY = "test/cpu_test/tiny_simclr"


def test_function_and_class_steps_are_callables():
    @register_train_step("test_fn_step")
    def fn_step(task):
        return task

    try:
        assert get_train_step("test_fn_step") is fn_step
        step = get_train_step("standard_train_step")
        assert isinstance(step, StandardTrainStep) and callable(step)
    finally:
        TRAIN_STEP_REGISTRY.unregister("test_fn_step")


def test_unknown_step_names_standard_step():
    with pytest.raises(UnknownNameError) as info:
        get_train_step("standard_trainstep")
    assert "standard_train_step" in str(info.value)


def test_misspelt_step_in_config_stops_the_run(tmp_path):
    with pytest.raises(UnknownNameError, match="Did you mean 'standard_train_step'"):
        run_config(
            TINY,
            "config.TRAINER.TRAIN_STEP_NAME=standard_trian_step",
            f"config.CHECKPOINT.DIR={tmp_path}",
        )


def test_section_order_with_hooks(tmp_path):
    log: list[str] = []

    @register_train_step("test_recording_step")
    class RecordingStep(StandardTrainStep):
        def read_sample(self, task):
            log.append("read_sample")
            return super().read_sample(task)

        def forward(self, task, sample):
            log.append("forward")
            return super().forward(task, sample)

        def compute_loss(self, task, out, sample):
            log.append("loss_compute")
            return super().compute_loss(task, out, sample)

        def reduce_loss_for_logging(self, task, loss):
            log.append("loss_all_reduce")
            return super().reduce_loss_for_logging(task, loss)

        def update_meters(self, task, out, sample):
            log.append("meters_update")
            return super().update_meters(task, out, sample)

        def backward(self, task, loss):
            log.append("backward")
            return super().backward(task, loss)

        def optimizer_step(self, task):
            log.append("optimizer_step")
            return super().optimizer_step(task)

    class EventLog(VisslHook):
        pass

    for event in HOOK_EVENTS:
        setattr(EventLog, event, (lambda e: lambda self, task: log.append(e))(event))

    try:
        run_config(
            TINY,
            "config.TRAINER.TRAIN_STEP_NAME=test_recording_step",
            "config.OPTIMIZER.num_epochs=1",
            "config.DATA.TRAIN.DATA_LIMIT=4",
            f"config.CHECKPOINT.DIR={tmp_path}",
            hook_generator=lambda cfg: [EventLog()],
        )
    finally:
        TRAIN_STEP_REGISTRY.unregister("test_recording_step")
    one_step = [
        "read_sample",
        "forward",
        "on_forward",
        "loss_compute",
        "loss_all_reduce",
        "meters_update",
        "on_loss_and_meter",
        "backward",
        "on_backward",
        "optimizer_step",
        "on_update",
        "on_step",
    ]
    # 4 samples, batch 4: one step, then read_sample hits the end of the data.
    assert log == ["on_start", "on_phase_start", *one_step, "read_sample", "on_phase_end", "on_end"]


def test_dict_loss_extras_are_logged_beside_the_loss(tmp_path):
    @register_loss("test_dict_simclr")
    class DictSimclr(nn.Module):
        def __init__(self, **kwargs):
            super().__init__()
            self.inner = SimclrInfoNCELoss(temperature=0.1)

        def forward(self, output, target):
            loss = self.inner(output, target)
            return {"loss": loss, "half": loss.detach() / 2}

    try:
        run_config(
            TINY,
            "config.LOSS.name=test_dict_simclr",
            "config.LOG_FREQUENCY=1",
            f"config.CHECKPOINT.DIR={tmp_path}",
        )
    finally:
        LOSS_REGISTRY.unregister("test_dict_simclr")
    records = read_jsonl(str(tmp_path / "stdout.json"))
    assert len(records) == 8
    for r in records:
        assert {"iteration", "loss", "lr"} <= set(r)
        assert r["loss.half"] == pytest.approx(r["loss"] / 2, rel=1e-5)


def test_no_device_reads_between_log_iterations(tmp_path, monkeypatch):
    """Outside LOG_FREQUENCY iterations nothing is read back from tensors to the host."""
    state = {"on": False, "iteration": -1}
    reads: list[int] = []

    def counting(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, **k):
            if state["on"]:
                reads.append(state["iteration"])
            return original(self, *a, **k)

        return wrapper

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))

    orig_read = StandardTrainStep.read_sample

    def read_sample(self, task):  # the data pipeline runs on the host by design
        state["on"] = False
        try:
            return orig_read(self, task)
        finally:
            state["on"] = True
            state["iteration"] = task.iteration + 1

    monkeypatch.setattr(StandardTrainStep, "read_sample", read_sample)

    class Gate(VisslHook):
        priority = -1000

        def on_phase_start(self, task):
            state["on"] = True

        def on_phase_end(self, task):
            state["on"] = False

    from vissl.hooks import default_hook_generator

    run_config(
        TINY,
        "config.LOG_FREQUENCY=1000",
        "config.OPTIMIZER.num_epochs=2",
        f"config.CHECKPOINT.DIR={tmp_path}",
        hook_generator=lambda cfg: [Gate(), *default_hook_generator(cfg)],
    )
    # 8 steps; only the first is a log iteration (LOG_FREQUENCY=1000).
    assert reads, "the first iteration logs, so some reads are expected"
    assert set(reads) == {1}, f"host reads at iterations {sorted(set(reads))}"

"""A loss called from a plain PyTorch loop, with a teacher the caller holds, computes what the
trainer's standard step computes: the trainer's path (MomentumTeacherHook hands the
teacher's output and temperature to the loss through ``task.last_batch.loss_inputs``) and
the direct call ``loss(student(x), teacher_output=teacher(global crops),
teacher_temp=loss.teacher_temp_at(0))`` give the same loss on the same batch (quick_dino,
one train step, CPU, fp32)."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from tests._tiny_run import train_in_process
from vissl.hooks import Priority, VisslHook
from vissl.hooks.momentum_teacher_hook import MomentumTeacherHook
from vissl.losses import build_loss
from vissl.losses.dino_loss import DINOLoss
from vissl.models.momentum import MomentumTeacher, build_momentum_schedule
from vissl.trainer.precision import Precision
from vissl.utils.hydra_config import hydra_compose_and_validate

QUICK = "test/integration_test/quick_dino"


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, list | tuple):
        return [_clone(v) for v in value]
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _one(output: Any) -> torch.Tensor:
    while not isinstance(output, torch.Tensor):
        (output,) = list(output)
    return output


class FirstStep(VisslHook):
    """Keeps the student at the start, and the first train step's batch, teacher inputs
    and logged loss (runs after MomentumTeacherHook: lowest priority)."""

    priority = Priority.LOWEST

    def __init__(self) -> None:
        self.sample: Any = None
        self.loss_inputs: dict[str, Any] = {}
        self.loss: float | None = None

    def on_start(self, task: Any) -> None:
        self.student = copy.deepcopy(task.base_model)
        self.teacher = copy.deepcopy(task.loss.teacher)

    def on_forward(self, task: Any) -> None:
        if self.sample is None and task.train:
            self.sample = _clone(task.last_batch.sample)
            self.loss_inputs = _clone(task.last_batch.loss_inputs)

    def on_loss_and_meter(self, task: Any) -> None:
        if self.loss is None and task.train:
            self.loss = float(task.last_batch.loss)


@pytest.fixture(scope="module")
def trainer_step(tmp_path_factory) -> tuple[Any, FirstStep, Any]:
    folder = tmp_path_factory.mktemp("plain_loop_dino")
    _, cfg = hydra_compose_and_validate(
        [
            f"config={QUICK}",
            f"config.CHECKPOINT.DIR={folder}",
            "config.OPTIMIZER.num_epochs=1",
            "config.DATA.TRAIN.DATA_LIMIT=8",  # one step of 8 images
        ]
    )
    rec = FirstStep()
    task = train_in_process(cfg, [rec])
    return cfg, rec, task


def test_the_trainer_ran_the_momentum_teacher_hook(trainer_step) -> None:
    _, rec, task = trainer_step
    assert any(isinstance(h, MomentumTeacherHook) for h in task.hooks)
    assert rec.loss is not None and set(rec.loss_inputs) == {"teacher_output", "teacher_temp"}


@pytest.fixture
def one_thread() -> Any:
    """A model this small runs fastest on one thread (as in ``train_in_process``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_plain_loop_call_gives_the_trainers_loss(trainer_step, one_thread) -> None:
    cfg, rec, _ = trainer_step
    # the loss as the trainer built it (num_crops, output_dim inferred from the config)
    loss = build_loss(cfg.LOSS, cfg)
    assert isinstance(loss, DINOLoss) and loss.num_crops == 4 and loss.output_dim == 64
    loss.train()
    # a teacher the caller holds, made from the student as it was at the start
    student = rec.student
    teacher = MomentumTeacher(student, build_momentum_schedule("cosine", loss.momentum))
    for name, p in teacher.module.named_parameters():
        assert torch.equal(p, dict(rec.teacher.named_parameters())[name]), name
    crops = rec.sample["input"]
    assert isinstance(crops, list) and len(crops) == 4
    student.train()
    output = student(crops)
    teacher_output = _one(teacher(crops[:2]))  # the global crops, crops_for_teacher [0, 1]
    torch.testing.assert_close(teacher_output, rec.loss_inputs["teacher_output"], rtol=0, atol=0)
    temp = loss.teacher_temp_at(0)
    assert temp == rec.loss_inputs["teacher_temp"] == 0.04
    value = loss(output, teacher_output=teacher_output, teacher_temp=temp)
    assert torch.isfinite(value)
    assert value.item() == pytest.approx(rec.loss, rel=1e-6, abs=0)
    # the control: another temperature gives another loss
    other = DINOLoss(output_dim=64, num_crops=4)
    assert other(output, teacher_output=teacher_output, teacher_temp=0.07).item() != (
        pytest.approx(rec.loss, rel=1e-6, abs=0)
    )


def test_on_forward_hands_the_direct_computation_to_the_loss() -> None:
    """MomentumTeacherHook.on_forward on a stand-in task: its loss_inputs are the
    teacher's output on the global crops and the temperature of the iteration."""
    torch.manual_seed(0)

    class ListModel(nn.Module):
        """A model that takes a list of crops, as vissl's models do."""

        def __init__(self) -> None:
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(5, 8), nn.GELU(), nn.Linear(8, 6))

        def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
            return self.mlp(torch.cat(xs))

    student = ListModel()
    loss = DINOLoss(output_dim=6, num_crops=3, teacher_temp_warmup_iters=10)
    loss.bind_model(student)
    crops = [torch.randn(4, 5) for _ in range(3)]
    task = SimpleNamespace(
        iteration=4,
        train_phase_idx=0,
        train=True,
        channels_last=False,
        precision=Precision(),  # fp32
        last_batch=SimpleNamespace(sample={"input": crops}, loss_inputs={}),
    )
    MomentumTeacherHook(loss).on_forward(task)
    got = task.last_batch.loss_inputs
    teacher = MomentumTeacher(student, build_momentum_schedule("cosine", 0.996))
    expected = teacher(crops[:2])
    torch.testing.assert_close(got["teacher_output"], expected, rtol=0, atol=0)
    assert expected.shape == (2 * 4, 6)  # the global crops only
    assert got["teacher_temp"] == pytest.approx(0.04 + (0.07 - 0.04) * 4 / 10)
    assert got["teacher_temp"] == loss.teacher_temp_at(4)

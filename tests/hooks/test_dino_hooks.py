"""DINOHook on in-memory runs of quick_dino (2 epochs of 2 steps): the teacher is a separate,
frozen, plain module; it follows the student by DINO's cosine EMA exactly; it runs in eval
mode except BatchNorm; the temperature warms up and the center follows the teacher's
outputs; the collapse warning; a compiled student."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from tests._tiny_run import train_in_process
from vissl.config.attr_dict import AttrDict
from vissl.hooks import Priority, VisslHook, default_hook_generator
from vissl.hooks.dino_hooks import DINOHook
from vissl.losses.dino_loss import DINOLoss
from vissl.utils.hydra_config import hydra_compose_and_validate

QUICK = "test/integration_test/quick_dino"
BASE_MOMENTUM = 0.5  # far from 1, so that the teacher moves measurably in 4 steps


def quick_config(folder: Any, *overrides: str) -> AttrDict:
    _, cfg = hydra_compose_and_validate(
        [f"config={QUICK}", f"config.CHECKPOINT.DIR={folder}", *overrides]
    )
    return cfg


def _params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


class Recorder(VisslHook):
    """Records the student, teacher, temperatures and teacher outputs of a run.

    Runs after DINOHook in every event (lowest priority): at ``on_forward`` the teacher
    output of the batch is set; at ``on_update`` the teacher has followed the student.
    """

    priority = Priority.LOWEST

    def __init__(self) -> None:
        self.students: list[dict[str, torch.Tensor]] = []
        self.teachers: list[dict[str, torch.Tensor]] = []
        self.update_iterations: list[int] = []
        self.temps: list[tuple[int, float]] = []
        self.teacher_outputs: list[torch.Tensor] = []
        self.bad_modes: list[str] = []
        self.teacher_calls = 0
        self.student_modes: list[bool] = []

    def on_start(self, task: Any) -> None:
        teacher = task.loss.teacher
        self.student0 = _params(task.base_model)
        self.teacher0 = _params(teacher)
        self.center0 = task.loss.center.clone()
        self.max_iteration = task.max_iteration

        def check_mode(name: str, module: nn.Module) -> Any:
            expect = isinstance(module, nn.modules.batchnorm._BatchNorm)

            def pre_hook(mod: nn.Module, args: Any) -> None:
                if mod.training != expect:
                    self.bad_modes.append(f"{name or 'teacher'}: training={mod.training}")

            return pre_hook

        for name, module in teacher.named_modules():
            module.register_forward_pre_hook(check_mode(name, module))
        teacher.register_forward_pre_hook(
            lambda *_: setattr(self, "teacher_calls", self.teacher_calls + 1)
        )

    def on_forward(self, task: Any) -> None:
        inputs = task.last_batch.loss_inputs
        self.temps.append((task.iteration, inputs["teacher_temp"]))
        self.teacher_outputs.append(inputs["teacher_output"].detach().clone())
        self.student_modes.append(task.base_model.training)

    def on_update(self, task: Any) -> None:
        self.update_iterations.append(task.iteration)
        self.students.append(_params(task.base_model))
        self.teachers.append(_params(task.loss.teacher))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Any, Recorder]:
    folder = tmp_path_factory.mktemp("dino_run")
    cfg = quick_config(folder, f"config.LOSS.dino_loss.momentum={BASE_MOMENTUM}")
    recorder = Recorder()
    # the hooks of a real run (last-layer freeze, gradient clipping), plus the recorder
    task = train_in_process(cfg, [*default_hook_generator(cfg), recorder])
    return task, recorder


def test_the_teacher_is_a_separate_frozen_plain_module(run) -> None:
    task, rec = run
    teacher = task.loss.teacher
    assert isinstance(task.loss, DINOLoss)
    assert isinstance(teacher, nn.Module) and type(teacher) is type(task.base_model)
    assert not isinstance(teacher, nn.parallel.DistributedDataParallel)
    assert not hasattr(teacher, "_orig_mod") and not hasattr(teacher, "module")
    student_storages = {p.untyped_storage().data_ptr() for p in task.base_model.parameters()}
    student_storages |= {b.untyped_storage().data_ptr() for b in task.base_model.buffers()}
    for name, t in [*teacher.named_parameters(), *teacher.named_buffers()]:
        assert t.untyped_storage().data_ptr() not in student_storages, name
    for name, p in teacher.named_parameters():
        assert not p.requires_grad and p.grad is None, name
    optimized = {id(p) for group in task.optimizer.param_groups for p in group["params"]}
    assert not optimized & {id(p) for p in teacher.parameters()}
    # it starts as a copy of the student
    assert rec.teacher0.keys() == rec.student0.keys()
    assert all(torch.equal(rec.teacher0[n], rec.student0[n]) for n in rec.student0)


def test_the_teacher_follows_the_cosine_ema_of_the_students_history(run) -> None:
    """t_{k+1} = m_k t_k + (1 - m_k) s_{k+1}, where s_{k+1} is the student after optimizer
    step k (k = 0..K-1) and m_k = 1 - (1 - m) (cos(pi k / K) + 1) / 2 (DINO)."""
    task, rec = run
    steps = task.max_iteration
    assert steps == 4 and rec.update_iterations == list(range(steps))
    expected = {n: v.double() for n, v in rec.teacher0.items()}
    constant = dict(expected)  # control: a constant momentum
    for k in range(steps):
        m = 1 - (1 - BASE_MOMENTUM) * (math.cos(math.pi * k / steps) + 1) / 2
        for n, s in rec.students[k].items():
            expected[n] = m * expected[n] + (1 - m) * s.double()
            constant[n] = BASE_MOMENTUM * constant[n] + (1 - BASE_MOMENTUM) * s.double()
        for n, got in rec.teachers[k].items():
            torch.testing.assert_close(got.double(), expected[n], rtol=0, atol=1e-6)
    final = _params(task.loss.teacher)
    assert all(torch.equal(final[n], rec.teachers[-1][n]) for n in final)
    # the schedule matters at this tolerance, and the teacher lags the student
    assert max((constant[n] - expected[n]).abs().max() for n in expected) > 1e-5
    last_student = rec.students[-1]
    assert any(not torch.equal(final[n], last_student[n]) for n in final)


def test_the_last_layer_is_frozen_for_the_first_step(run) -> None:
    # quick_dino: TEMP_FROZEN_PARAMS_ITER_MAP [["module.heads.0.prototypes0.weight", 1]]
    _, rec = run
    name = "heads.0.prototypes0.weight"
    assert torch.equal(rec.students[0][name], rec.student0[name])
    assert not torch.equal(rec.students[1][name], rec.student0[name])
    other = "heads.0.mlp.0.weight"
    assert not torch.equal(rec.students[0][other], rec.student0[other])


def test_the_teacher_runs_in_eval_mode_except_batchnorm(run) -> None:
    task, rec = run
    assert rec.teacher_calls == 4  # once per training batch, on the 2 global crops
    assert rec.bad_modes == []
    assert rec.student_modes == [True] * 4
    bns = [m for m in task.loss.teacher.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and all(int(m.num_batches_tracked) == 4 for m in bns)  # batch statistics


def test_temperature_warm_up_and_center_along_the_run(run) -> None:
    task, rec = run
    # teacher_temp_warmup_iters: 2 in quick_dino; 0.04 -> 0.07
    assert [i for i, _ in rec.temps] == [0, 1, 2, 3]
    assert [t for _, t in rec.temps] == pytest.approx([0.04, 0.055, 0.07, 0.07])
    assert all(t.shape == (2 * 8, 64) for t in rec.teacher_outputs)
    center = rec.center0.double()
    for rows in rec.teacher_outputs:
        center = 0.9 * center + 0.1 * rows.double().mean(dim=0, keepdim=True)
    torch.testing.assert_close(task.loss.center.double(), center, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- collapse
def _warnings(caplog, mean: float, train: bool = True) -> list[str]:
    hook = DINOHook(DINOLoss(output_dim=64, teacher_temp_warmup_iters=0))
    task = SimpleNamespace(train=train, phase_idx=3, phase_average_loss=lambda: mean)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vissl.hooks.momentum_teacher_hook"):
        hook.on_phase_end(task)
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_loss_at_ln_output_dim_is_reported_as_collapse(caplog) -> None:
    (msg,) = _warnings(caplog, math.log(64) + 1e-3)
    assert "collapsed" in msg and "ln(output_dim) = 4.1589" in msg and "phase 3" in msg
    assert "teacher_temp_max" in msg and "ema_center" in msg  # says what to try


@pytest.mark.parametrize(
    "mean,train", [(math.log(64) - 0.5, True), (math.log(64), False), (float("nan"), True)]
)
def test_no_collapse_warning_otherwise(caplog, mean: float, train: bool) -> None:
    assert _warnings(caplog, mean, train) == []


# ----------------------------------------------------------------------------- compile
@pytest.mark.slow
def test_with_a_compiled_student_the_teacher_stays_a_plain_module(tmp_path) -> None:
    cfg = quick_config(
        tmp_path,
        "config.MODEL.COMPILE.USE_COMPILE=true",
        "config.MODEL.COMPILE.BACKEND=eager",
        "config.OPTIMIZER.num_epochs=1",
    )
    recorder = Recorder()
    task = train_in_process(cfg, [recorder])
    assert isinstance(task.model, torch._dynamo.eval_frame.OptimizedModule)
    teacher = task.loss.teacher
    assert not isinstance(teacher, torch._dynamo.eval_frame.OptimizedModule)
    assert type(teacher) is type(task.base_model) and not hasattr(teacher, "_orig_mod")
    assert all(not p.requires_grad and p.grad is None for p in teacher.parameters())
    assert recorder.teacher_calls == 2 and recorder.bad_modes == []
    moved = _params(teacher)
    assert any(not torch.equal(moved[n], recorder.teacher0[n]) for n in moved)
    assert math.isfinite(task.phase_average_loss())


# ----------------------------------------------------------------------------- test phases
TEST_PHASES = [
    "config.TEST_MODEL=True",
    "config.DATA.TEST.DATA_SOURCES=[synthetic]",
    "config.DATA.TEST.LABEL_TYPE=sample_index",
    "config.DATA.TEST.BATCHSIZE_PER_REPLICA=8",
    "config.DATA.TEST.DATA_LIMIT=8",
    "config.DATA.TEST.DEFAULT_GRAY_IMG_SIZE=24",
    "config.DATA.TEST.COLLATE_FUNCTION=multicrop_collator",
    "config.DATA.TEST.TRANSFORMS=[{name: ImgPilToMultiCrop, total_num_crops: 4, "
    "size_crops: [16, 8], num_crops: [2, 2], crop_scales: [[0.4, 1.0], [0.1, 0.4]]}, "
    "{name: ToTensor}]",
    "config.OPTIMIZER.num_epochs=1",
]


class PhaseCenters(VisslHook):
    def __init__(self) -> None:
        self.test_phases: list[tuple[torch.Tensor, torch.Tensor]] = []

    def on_phase_start(self, task: Any) -> None:
        self.start = task.loss.center.clone()

    def on_phase_end(self, task: Any) -> None:
        if not task.train:
            self.test_phases.append((self.start, task.loss.center.clone()))


def test_test_phases_do_not_move_the_center(tmp_path) -> None:
    recorder = PhaseCenters()
    train_in_process(quick_config(tmp_path, *TEST_PHASES), [recorder])
    assert len(recorder.test_phases) == 1
    ((start, end),) = recorder.test_phases
    assert torch.equal(start, end)

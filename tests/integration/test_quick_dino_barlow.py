"""DINO and Barlow Twins end to end: the quick configs run unchanged through the CLI, the
DINO checkpoint holds the teacher and the center, a crash (and a real SIGKILL) plus
auto-resume ends bitwise equal to an uninterrupted run (student, teacher and center), and
on 2 processes the teacher stays a plain module, equal on every rank."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from tests._cli import run_script
from tests.integration._runs import REPO, read_jsonl, run_config
from tests.integration.test_exact_resume import crash_generator
from vissl.hooks import VisslHook, default_hook_generator
from vissl.utils.checkpoint import load_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

TOOL = os.path.join(REPO, "tools", "run_distributed_engines.py")
QUICK = "test/integration_test/"
DINO = QUICK + "quick_dino"


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    env["OMP_NUM_THREADS"] = "1"
    return run_script(TOOL, *args, cwd=cwd, env=env)


def final_state(folder: Path) -> dict[str, torch.Tensor]:
    """The final checkpoint's model (``trunk.*``, ``heads.*``) and loss state (``loss.*``)."""
    (path,) = folder.glob("model_final_checkpoint_phase*.torch")
    classy = load_checkpoint(str(path))["classy_state_dict"]
    model = classy["base_model"]["model"]
    state = {f"trunk.{k}": v for k, v in model["trunk"].items()}
    state |= {f"heads.{k}": v for k, v in model["heads"].items()}
    state |= {f"loss.{k}": v for k, v in classy["loss"].items()}
    return state


def assert_dino_checkpoint(folder: Path, output_dim: int = 64) -> dict[str, torch.Tensor]:
    state = final_state(folder)
    center = state["loss.center"]
    assert center.shape == (1, output_dim) and torch.isfinite(center).all()
    assert center.abs().sum() > 0  # it moved from zero
    student = {k: v for k, v in state.items() if not k.startswith("loss.")}
    teacher = {
        k.removeprefix("loss.teacher."): v
        for k, v in state.items()
        if k.startswith("loss.teacher.")
    }
    assert teacher.keys() == student.keys()  # the whole model: trunk and heads
    assert all(teacher[k].shape == student[k].shape for k in student)
    moved = [k for k in student if student[k].is_floating_point()]
    assert any(not torch.equal(teacher[k], student[k]) for k in moved)  # it lags
    return state


# ----------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("name", ["quick_dino", "quick_dino_vit"])
def test_quick_dino_configs_run_unchanged_and_checkpoint_teacher_and_center(tmp_path, name) -> None:
    if not os.path.exists(os.path.join(REPO, "configs", "config", QUICK, f"{name}.yaml")):
        pytest.skip(f"{name}.yaml is not in configs/config/{QUICK}")
    proc = run_cli(tmp_path, f"config={QUICK}{name}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / name  # the config's own CHECKPOINT.DIR, in the cwd
    assert (folder / "model_final_checkpoint_phase1.torch").exists()
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in records)
    assert_dino_checkpoint(folder)


def test_quick_barlow_twins_runs_unchanged(tmp_path) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}quick_barlow_twins")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / "quick_barlow_twins"
    state = final_state(folder)
    assert not any(k.startswith("loss.") for k in state)  # a stateless loss
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in records)


# ----------------------------------------------------------------------------- ViT teacher
class TeacherIsDeterministic(VisslHook):
    """Runs the teacher again on the batch's global crops: with dropout and drop path off
    (eval mode) and no BatchNorm in a ViT, the output is exactly the same."""

    priority = 1000  # after the teacher hook handed the loss its teacher_output

    def __init__(self) -> None:
        self.checked = 0

    def on_forward(self, task: Any) -> None:
        loss = task.loss
        crops = loss.teacher_input(task.last_batch.sample["input"])
        with torch.no_grad():
            again = loss.teacher(crops)
        again = again[0] if isinstance(again, list | tuple) else again
        assert torch.equal(again, task.last_batch.loss_inputs["teacher_output"])
        assert task.base_model.training
        self.checked += 1


def test_vit_teacher_has_no_drop_path(tmp_path) -> None:
    name = "quick_dino_vit"
    if not os.path.exists(os.path.join(REPO, "configs", "config", QUICK, f"{name}.yaml")):
        pytest.skip(f"{name}.yaml is not in configs/config/{QUICK}")
    hook = TeacherIsDeterministic()
    run_config(
        QUICK + name,
        "config.OPTIMIZER.num_epochs=1",
        f"config.CHECKPOINT.DIR={tmp_path}",
        hook_generator=lambda cfg: [*default_hook_generator(cfg), hook],
    )
    assert hook.checked == 2


# ----------------------------------------------------------------------------- resume
RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 4 steps per phase, 8 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


def assert_bitwise_equal(full: dict[str, torch.Tensor], resumed: dict[str, torch.Tensor]) -> None:
    assert full.keys() == resumed.keys()
    assert "loss.center" in full and any(k.startswith("loss.teacher.") for k in full)
    different = [k for k in full if not torch.equal(full[k], resumed[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def test_crash_and_resume_restores_student_teacher_and_center_bitwise(tmp_path) -> None:
    """As tests/integration/test_exact_resume.py: a crash right after iteration 7 (the
    iteration checkpoint at 6 is inside phase 1), then auto-resume."""
    run_config(DINO, *RESUME, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            DINO, *RESUME, f"config.CHECKPOINT.DIR={crashed}", hook_generator=crash_generator(7)
        )
    assert not list(crashed.glob("model_final*"))
    run_config(DINO, *RESUME, f"config.CHECKPOINT.DIR={crashed}")
    log = (crashed / "log.txt").read_text()
    assert "resuming from" in log and "resumed inside phase" in log
    full = assert_dino_checkpoint(tmp_path / "full")
    assert_bitwise_equal(full, final_state(crashed))


SIGKILL_PLUGIN = '''
import os
import signal

from vissl.hooks import VisslHook, register_hook


@register_hook("sigkill_at")
class SigkillAt(VisslHook):
    """kill -9 of this process right after the given training iteration."""

    priority = 1000  # after the checkpoint hook

    def __init__(self, iteration):
        self.iteration = iteration

    def on_step(self, task):
        if task.train and task.iteration == self.iteration:
            os.kill(os.getpid(), signal.SIGKILL)
'''


def sigkill_and_resume_cli(tmp_path: Path, args: list[str], iteration: int) -> tuple[Path, Path]:
    """The CLI with ``args`` uninterrupted, then with a real kill -9 (no exception
    handling, no on_exception hooks) right after ``iteration`` and the same command again
    (auto-resume). Checks the kill left no final checkpoint and the rerun resumed inside
    the phase; returns the two checkpoint folders (uninterrupted, killed) to compare."""
    plugin = tmp_path / "sigkill_plugin.py"
    plugin.write_text(SIGKILL_PLUGIN)
    full, killed = tmp_path / "full", tmp_path / "killed"
    proc = run_cli(tmp_path, *args, f"config.CHECKPOINT.DIR={full}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli(
        tmp_path,
        *args,
        f"config.CHECKPOINT.DIR={killed}",
        f"config.IMPORTS=[{plugin}]",
        f"config.HOOKS.CUSTOM_HOOKS=[{{name: sigkill_at, iteration: {iteration}}}]",
    )
    assert proc.returncode == -9, proc.stderr[-3000:]
    assert not list(killed.glob("model_final*"))
    proc = run_cli(tmp_path, *args, f"config.CHECKPOINT.DIR={killed}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed inside phase" in (killed / "log.txt").read_text()
    return full, killed


@pytest.mark.slow
def test_sigkill_and_resume_through_the_cli_is_bitwise_exact(tmp_path) -> None:
    """A real kill -9 (no exception handling, no on_exception hooks) after iteration 7."""
    full, killed = sigkill_and_resume_cli(tmp_path, [f"config={DINO}", *RESUME], iteration=7)
    assert_bitwise_equal(final_state(full), final_state(killed))


# ----------------------------------------------------------------------------- 2 processes
class DumpTeacher(VisslHook):
    """Each rank writes what its teacher is, and its teacher and center, at the end."""

    priority = 1000

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_end(self, task: Any) -> None:
        from vissl.utils.distributed import get_rank

        teacher = task.loss.teacher
        info = {
            "model": type(task.model).__name__,
            "teacher": type(teacher).__name__,
            "teacher_has_wrapper": hasattr(teacher, "module") or hasattr(teacher, "_orig_mod"),
            "frozen": all(not p.requires_grad and p.grad is None for p in teacher.parameters()),
        }
        rank = get_rank()
        with open(os.path.join(self.folder, f"teacher_rank{rank}.json"), "w") as f:
            json.dump(info, f)
        torch.save(
            {"teacher": teacher.state_dict(), "center": task.loss.center},
            os.path.join(self.folder, f"teacher_rank{rank}.torch"),
        )


def test_two_processes_keep_one_plain_teacher_and_center_on_every_rank(tmp_path) -> None:
    run_config(
        DINO,
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
        f"config.CHECKPOINT.DIR={tmp_path}",
        hook_generator=lambda cfg: [*default_hook_generator(cfg), DumpTeacher(str(tmp_path))],
    )
    infos = [json.loads((tmp_path / f"teacher_rank{r}.json").read_text()) for r in range(2)]
    for info in infos:
        assert info["model"] == "DistributedDataParallel"  # the student is wrapped...
        assert info["teacher"] == "BaseSSLMultiInputOutputModel"  # ...the teacher is not
        assert not info["teacher_has_wrapper"] and info["frozen"]
    states = [torch.load(tmp_path / f"teacher_rank{r}.torch") for r in range(2)]
    assert torch.equal(states[0]["center"], states[1]["center"])
    a, b = states[0]["teacher"], states[1]["teacher"]
    params = [k for k in a if "running_" not in k and "num_batches" not in k]
    different = [k for k in params if not torch.equal(a[k], b[k])]
    assert not different, f"the ranks' teachers differ in {different[:3]}"
    saved = final_state(tmp_path)
    assert torch.equal(saved["loss.center"], states[0]["center"])

"""BYOL and SimSiam end to end: the quick configs run unchanged through the CLI, BYOL's
checkpoint holds the target network (the model less its predictor), and a crash (and, with
``-m slow``, a real SIGKILL) plus auto-resume ends bitwise equal to an uninterrupted run
(model, predictor and target network)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.integration._runs import read_jsonl, run_config
from tests.integration.test_exact_resume import crash_generator
from tests.integration.test_quick_dino_barlow import final_state, run_cli, sigkill_and_resume_cli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

QUICK = "test/integration_test/"


def assert_byol_checkpoint(state: dict[str, torch.Tensor]) -> None:
    model = {k: v for k, v in state.items() if not k.startswith("loss.")}
    target = {
        k.removeprefix("loss.target_network."): v
        for k, v in state.items()
        if k.startswith("loss.target_network.")
    }
    predictor = {k for k in model if k.startswith("heads.1.")}
    assert predictor  # the model has its predictor...
    assert target.keys() == model.keys() - predictor  # ...the target has all but it
    floats = [k for k in target if target[k].is_floating_point() and "running" not in k]
    assert any(not torch.equal(target[k], model[k]) for k in floats)  # it lags


@pytest.mark.parametrize("name", ["byol", "simsiam"])
def test_quick_config_runs_unchanged(tmp_path: Path, name: str) -> None:
    proc = run_cli(tmp_path, f"config={QUICK}quick_{name}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "checkpoints" / f"quick_{name}"
    records = read_jsonl(str(folder / "stdout.json"))
    assert [r["iteration"] for r in records] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in records)
    state = final_state(folder)
    if name == "byol":
        assert all(0 <= r["loss"] <= 8 for r in records)  # two terms of 2 - 2 cos
        assert_byol_checkpoint(state)
    else:
        assert all(-1 <= r["loss"] <= 1 for r in records)
        assert not any(k.startswith("loss.") for k in state)  # no state of its own
        assert "simsiam: per-dimension std" in proc.stderr + proc.stdout


RESUME = [
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",  # 4 steps per phase, 8 in all
    "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
    "config.CHECKPOINT.AUTO_RESUME=True",
]


def assert_bitwise_equal(full: dict[str, torch.Tensor], resumed: dict[str, torch.Tensor]) -> None:
    assert full.keys() == resumed.keys()
    different = [k for k in full if not torch.equal(full[k], resumed[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


@pytest.mark.parametrize(
    "name",
    ["byol", pytest.param("simsiam", marks=pytest.mark.slow)],  # SimSiam: no own state
)
@pytest.mark.slow
def test_crash_and_resume_is_bitwise_exact(tmp_path: Path, name: str) -> None:
    """A crash right after iteration 7 (the iteration checkpoint at 6 is inside phase 1),
    then auto-resume: model, predictor and (BYOL) target network as if never stopped."""
    config = QUICK + f"quick_{name}"
    run_config(config, *RESUME, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            config, *RESUME, f"config.CHECKPOINT.DIR={crashed}", hook_generator=crash_generator(7)
        )
    assert not list(crashed.glob("model_final*"))
    run_config(config, *RESUME, f"config.CHECKPOINT.DIR={crashed}")
    assert "resumed inside phase" in (crashed / "log.txt").read_text()
    full = final_state(tmp_path / "full")
    if name == "byol":
        assert_byol_checkpoint(full)
    assert_bitwise_equal(full, final_state(crashed))


@pytest.mark.slow
def test_byol_sigkill_and_resume_through_the_cli_is_bitwise_exact(tmp_path: Path) -> None:
    """A real kill -9 after iteration 7, then the same command again."""
    full, killed = sigkill_and_resume_cli(
        tmp_path, [f"config={QUICK}quick_byol", *RESUME], iteration=7
    )
    assert_bitwise_equal(final_state(full), final_state(killed))

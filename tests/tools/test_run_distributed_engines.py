"""The command users run: tools/run_distributed_engines.py."""

from __future__ import annotations

import glob
import os
import re
import subprocess

import pytest

from tests._cli import run_script
from tests.integration._runs import REPO, read_jsonl

TOOL = os.path.join(REPO, "tools", "run_distributed_engines.py")


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    return run_script(TOOL, *args, cwd=REPO, env=env)


@pytest.mark.integration
def test_cli_trains_and_writes_vissl_outputs(tmp_path):
    out = tmp_path / "run"
    proc = run_tool(
        "config=test/cpu_test/tiny_simclr",
        "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=true",
        "config.HOOKS.PROGRESS_BAR=true",
        "config.LOG_FREQUENCY=1",
        f"config.CHECKPOINT.DIR={out}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in (
        "log.txt",
        "stdout.json",
        "metrics.json",
        "train_config.yaml",
        "checkpoint.torch",
        "model_final_checkpoint_phase1.torch",
    ):
        assert (out / name).exists(), name
    assert glob.glob(str(out / "tensorboard" / "events.out.tfevents.*"))
    records = read_jsonl(str(out / "stdout.json"))
    assert [r["iteration"] for r in records] == list(range(1, 9))
    assert all({"loss", "lr", "eta"} <= set(r) for r in records)
    log = (out / "log.txt").read_text()
    assert "iter: 8/8" in log and "eta:" in log
    # tqdm progress bar, with its rate (s/it when a step takes over a second)
    assert "train ep 2/2" in proc.stderr and re.search(r"(it/s|s/it)", proc.stderr)
    assert "TRAIN_STEP_NAME" in (out / "train_config.yaml").read_text()


@pytest.mark.integration
def test_cli_misspelt_step_and_key_are_clear_errors(tmp_path):
    proc = run_tool(
        "config=test/cpu_test/tiny_simclr",
        "config.TRAINER.TRAIN_STEP_NAME=standard_step",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    assert proc.returncode == 2
    assert "Did you mean 'standard_train_step'?" in proc.stderr
    proc = run_tool("config=test/cpu_test/tiny_simclr", "config.OPTIMIZER.num_epoch=3")
    assert proc.returncode == 2
    assert "Did you mean config.OPTIMIZER.num_epochs?" in proc.stderr

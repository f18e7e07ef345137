"""quick_start with the online kNN monitor, through the command line: a kNN top-1 is
logged every phase (stdout.json, metrics.json) and the last phase's value agrees with
``tools/nearest_neighbor_test.py`` on the final checkpoint (same k, same features)
within 0.5 point. The fast variant shortens the training (3 epochs of 512 digits, the
full bank and queries); the 30-epoch recipe is behind ``slow``."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.integration._runs import REPO, read_jsonl

NN = "benchmark/nearest_neighbor/digits/nn_digits_quick_start"


def _run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=1200
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _train_and_compare(folder, epochs: int, *overrides: str) -> tuple[list[float], float]:
    _run(
        "tools/run_distributed_engines.py",
        "config=quick_start",
        f"config.CHECKPOINT.DIR={folder}",
        f"config.OPTIMIZER.num_epochs={epochs}",
        "config.HOOKS.ONLINE_KNN.USE=true",
        "config.HOOKS.PROGRESS_BAR=false",
        *overrides,
    )
    ends = [r for r in read_jsonl(str(folder / "stdout.json")) if r.get("phase_end")]
    online = [r["train_online_knn_top_1"] for r in ends]
    metrics = read_jsonl(str(folder / "metrics.json"))
    assert [m["train_online_knn"]["top_1"] for m in metrics] == online
    assert len(online) == epochs
    out = _run(
        "tools/nearest_neighbor_test.py",
        f"config={NN}",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={folder}/model_final_checkpoint_phase{epochs - 1}.torch",
        f"config.CHECKPOINT.DIR={folder}/nn",
    )
    last = out.strip().splitlines()[-1]
    match = re.search(r"top-1 (\d+\.\d+)%", last)
    assert match, last
    summary = json.load(open(folder / "summary.json"))
    assert summary["train"]["final"]["metrics"]["train_online_knn_top_1"] == online[-1]
    return online, float(match.group(1))


@pytest.mark.integration
def test_short_quick_start_online_knn_agrees_with_the_offline_tool(tmp_path) -> None:
    online, offline = _train_and_compare(
        tmp_path,
        3,
        "config.DATA.TRAIN.DATA_LIMIT=512",
        "config.DATA.NUM_DATALOADER_WORKERS=0",
        "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=false",
    )
    assert abs(online[-1] - offline) <= 0.5


@pytest.mark.slow
@pytest.mark.integration
def test_quick_start_30_epochs_online_knn_agrees_with_the_offline_tool(tmp_path) -> None:
    online, offline = _train_and_compare(tmp_path, 30)
    assert abs(online[-1] - offline) <= 0.5
    assert online[-1] > 95.0  # it learned: random init scores 93.87% (6.13% error)

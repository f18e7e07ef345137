"""VISSL's own CPU test configs run unchanged (synthetic data, CPU, gloo)."""

from __future__ import annotations

import math

import pytest

from tests.integration._runs import read_jsonl, run_config


@pytest.mark.integration
@pytest.mark.parametrize("name", ["test_cpu_resnet_simclr", "test_cpu_regnet_simclr"])
def test_vissl_simclr_cpu_configs(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)  # the configs write to CHECKPOINT.DIR "."
    with pytest.warns(UserWarning):  # legacy TRUNK_PARAMS / MONITOR_PERF_STATS keys
        task = run_config(f"test/cpu_test/{name}")
    assert task.iteration == 2  # DATA_LIMIT 4, batch 2
    assert (tmp_path / "model_final_checkpoint_phase0.torch").exists()
    assert (tmp_path / "checkpoint.torch").exists()
    # LARC SGD with the composite schedule scaled by auto LR scaling: 0.3 * 2 / 256
    assert math.isfinite(task.phase_average_loss())


@pytest.mark.integration
def test_vissl_supervised_train_and_test_with_topk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task = run_config("test/cpu_test/test_multiple_meters")
    assert [p["train"] for p in task.phases] == [True, False, True, False]
    metrics = read_jsonl(str(tmp_path / "metrics.json"))
    assert [("train_loss" in m, "test_loss" in m) for m in metrics] == [
        (True, False),
        (False, True),
        (True, False),
        (False, True),
    ]
    test_acc = metrics[-1]["test_accuracy_list_meter"]
    assert set(test_acc) == {"top_1", "top_5"}
    assert 0.0 <= float(next(iter(test_acc["top_5"].values()))) <= 100.0

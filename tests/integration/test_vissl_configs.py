"""CPU test configs in VISSL's key names run end to end (synthetic data, CPU, gloo).

``configs/config/test/cpu_test/cpu_*.yaml`` are our own configs exercising the features of
VISSL's CPU test configs: ResNet and RegNet trunks with SimCLR, and a supervised run with
several meters. VISSL's original files are not shipped; set ``VISSL_CONFIGS_DIR`` to
VISSL's ``configs/config`` folder (from a VISSL checkout) to run them unchanged too.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from tests._vissl_configs import copy_vissl_config, needs_vissl_configs
from tests.integration._runs import read_jsonl, run_config


@pytest.mark.integration
@pytest.mark.parametrize("name", ["cpu_resnet_simclr", "cpu_regnet_simclr"])
def test_simclr_cpu_configs(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)  # CHECKPOINT.DIR is relative to the current folder
    task = run_config(f"test/cpu_test/{name}")
    assert task.iteration == 2  # DATA_LIMIT 4, batch 2
    ckpt_dir = tmp_path / "checkpoints" / name
    assert (ckpt_dir / "model_final_checkpoint_phase0.torch").exists()
    assert (ckpt_dir / "checkpoint.torch").exists()
    assert math.isfinite(task.phase_average_loss())


@pytest.mark.integration
def test_supervised_train_and_test_with_multiple_meters(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task = run_config("test/cpu_test/cpu_multiple_meters")
    assert [p["train"] for p in task.phases] == [True, False, True, False]
    metrics = read_jsonl(str(tmp_path / "checkpoints" / "cpu_multiple_meters" / "metrics.json"))
    assert [("train_loss" in m, "test_loss" in m) for m in metrics] == [
        (True, False),
        (False, True),
        (True, False),
        (False, True),
    ]
    for meter in ("accuracy_list_meter", "precision_at_k_list_meter", "recall_at_k_list_meter"):
        values = metrics[-1][f"test_{meter}"]
        assert set(values) == {"top_1", "top_5"}
        for topk in values.values():
            assert all(0.0 <= float(v) <= 100.0 for v in topk.values())


VISSL_CPU_TESTS = ["test_cpu_resnet_simclr", "test_cpu_regnet_simclr", "test_multiple_meters"]


@pytest.mark.integration
@needs_vissl_configs
@pytest.mark.parametrize("name", VISSL_CPU_TESTS)
def test_vissl_original_cpu_configs(tmp_path, monkeypatch, name):
    config = copy_vissl_config(tmp_path, f"test/cpu_test/{name}.yaml", monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # legacy TRUNK_PARAMS / MONITOR_PERF_STATS keys
        task = run_config(config)
    assert task.iteration >= 2
    assert (tmp_path / "checkpoint.torch").exists()
    if name == "test_multiple_meters":
        assert [p["train"] for p in task.phases] == [True, False, True, False]
    else:
        assert math.isfinite(task.phase_average_loss())


# VISSL's quick_deepcluster_v2.yaml unchanged, but for what a CPU run without ImageNet
# needs: the device, the backend, synthetic images, and fewer of them (ResNet-50 at 224 px
# on a CPU); 2 processes as the file says (NUM_PROC_PER_NODE: 2, SyncBN).
VISSL_DEEPCLUSTER_V2_CPU = [
    "config.MACHINE.DEVICE=cpu",
    "config.DISTRIBUTED.BACKEND=gloo",
    "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
    "config.DATA.TRAIN.DATA_LIMIT=32",  # 16 images per process: 1 step of 16
    "config.DATA.NUM_DATALOADER_WORKERS=0",
]


@pytest.mark.integration
@pytest.mark.slow
@needs_vissl_configs
def test_vissl_original_quick_deepcluster_v2(tmp_path, monkeypatch):
    """Its keys are all accepted (the loss block's BATCHSIZE_PER_REPLICA and
    num_train_samples, memory_params.crops_for_mb; the old DISTRIBUTED.DISTR_ON is
    ignored with a warning, as VISSL ignores it); the run clusters the memory of both
    processes and trains. 3 minutes on 2 cores (8 under heavy load)."""
    from vissl.utils.checkpoint import load_checkpoint

    name = copy_vissl_config(
        tmp_path, "test/integration_test/quick_deepcluster_v2.yaml", monkeypatch
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DISTR_ON, COPY_DESTINATION_DIR (not implemented)
        run_config(name, *VISSL_DEEPCLUSTER_V2_CPU)
    records = read_jsonl(str(tmp_path / "stdout.json"))
    assert [r["iteration"] for r in records] == [1] and math.isfinite(records[0]["loss"])
    classy = load_checkpoint(str(tmp_path / "model_final_checkpoint_phase0.torch"))[
        "classy_state_dict"
    ]
    # num_train_samples 500 in the file; the run uses the data set's 32 (as VISSL does)
    assert classy["loss"]["assignments"].shape == (3, 32)
    assert (classy["loss"]["assignments"] >= 0).all()  # every sample clustered
    assert classy["loss"]["centroids0"].shape == (10, 128)  # mlp head: 2048 -> 128
    memories = [r["loss"]["local_memory_index"] for r in classy["per_rank"]]
    assert len(memories) == 2 and sorted(torch.cat(memories).tolist()) == list(range(32))

"""HOOKS.ONLINE_KNN: the distributed weighted kNN against a hand computation and the
offline tool's code, 2 gloo ranks with a sharded bank against 1 process, config errors,
and a short training run whose monitor values reach metrics.json, stdout.json,
TensorBoard, the summary and early stopping, and whose last value is the kNN of the
final model's features computed here independently."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from tests._tiny_run import train_in_process
from vissl.errors import ConfigError
from vissl.evaluation.knn import knn_classify
from vissl.hooks import default_hook_generator
from vissl.hooks.online_monitors import (
    OnlineKnnHook,
    _default_transforms,
    distributed_knn,
    monitor_split_config,
)
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo

N_BANK, N_QUERY, DIM, CLASSES, K, SIGMA = 53, 21, 8, 4, 5, 0.1


def _data() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(3)
    centers = torch.randn(CLASSES, DIM, generator=g)
    yb = torch.randint(0, CLASSES, (N_BANK,), generator=g)
    yq = torch.randint(0, CLASSES, (N_QUERY,), generator=g)
    xb = centers[yb] + 0.9 * torch.randn(N_BANK, DIM, generator=g)
    xq = centers[yq] + 0.9 * torch.randn(N_QUERY, DIM, generator=g)
    return F.normalize(xb, dim=1), yb, F.normalize(xq, dim=1), yq


def _hand_knn(xb, yb, xq, yq, k, sigma, classes):
    """Written from the definition: the k most similar bank rows vote exp(sim / sigma)."""
    top1 = top5 = 0
    for q, y in zip(xq.double().numpy(), yq.numpy(), strict=True):
        sims = xb.double().numpy() @ q
        order = np.argsort(-sims, kind="stable")[:k]
        votes = np.zeros(classes)
        for i in order:
            votes[yb[i]] += np.exp(sims[i] / sigma)
        ranked = np.argsort(-votes, kind="stable")
        top1 += int(ranked[0] == y)
        top5 += int(y in ranked[:5])
    return top1, top5


def _single(k: int = K) -> list[float]:
    xb, yb, xq, yq = _data()
    return distributed_knn(
        xq,
        yq,
        torch.ones(N_QUERY, dtype=torch.bool),
        xb,
        yb,
        torch.ones(N_BANK, dtype=torch.bool),
        k=k,
        sigma=SIGMA,
        num_classes=CLASSES,
    ).tolist()


@pytest.mark.parametrize("k", [1, K, 200])
def test_knn_matches_hand_computation_and_offline_code(k: int) -> None:
    xb, yb, xq, yq = _data()
    hits1, hits5, n = _single(k)
    assert n == N_QUERY
    assert (hits1, hits5) == _hand_knn(xb, yb, xq, yq, min(k, N_BANK), SIGMA, CLASSES)
    offline = knn_classify(xb, yb, xq, yq, k=k, sigma=SIGMA, num_classes=CLASSES)
    assert 100.0 * hits1 / n == pytest.approx(offline.top1)
    assert 100.0 * hits5 / n == pytest.approx(offline.top5)


def _sharded_worker(rank: int, world: int) -> list[float]:
    xb, yb, xq, yq = _data()

    # as the StatefulDistributedSampler shards (rank, rank + W, ...), padded with repeats
    def shard(x, y, n):
        per = -(-n // world)
        idx = [(rank + j * world) % n for j in range(per)]
        valid = torch.tensor([rank + j * world < n for j in range(per)])
        return x[idx], y[idx], valid

    bx, by, bv = shard(xb, yb, N_BANK)
    qx, qy, qv = shard(xq, yq, N_QUERY)
    return distributed_knn(qx, qy, qv, bx, by, bv, k=K, sigma=SIGMA, num_classes=CLASSES).tolist()


def test_two_ranks_with_a_sharded_bank_match_one_process() -> None:
    results = spawn_gloo(_sharded_worker, 2)
    assert results[0] == results[1] == _single()


# ---------------------------------------------------------------------- config
def _cfg(tmp_path, *overrides: str):
    _, cfg = hydra_compose_and_validate(
        [
            "config=quick_start",
            f"config.CHECKPOINT.DIR={tmp_path}",
            "config.DATA.NUM_DATALOADER_WORKERS=0",
            "config.DATA.TRAIN.DATA_LIMIT=64",
            "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=16",
            "config.OPTIMIZER.num_epochs=3",
            "config.LOG_FREQUENCY=2",
            "config.HOOKS.PROGRESS_BAR=false",
            "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=false",
            "config.HOOKS.ONLINE_KNN.USE=true",
            "config.HOOKS.ONLINE_KNN.BANK.DATA_LIMIT=96",
            "config.HOOKS.ONLINE_KNN.QUERY.DATA_LIMIT=40",
            "config.HOOKS.ONLINE_KNN.BANK_REFRESH_PHASES=2",
            *overrides,
        ]
    )
    return cfg


def test_default_transforms_follow_the_train_crop_and_normalize(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    assert _default_transforms(cfg.DATA.TRAIN.TRANSFORMS) == [
        {"name": "Resize", "size": 8},
        {"name": "ToTensor"},
        {"name": "Normalize", "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    ]
    big = [{"name": "RandomResizedCrop", "size": 224}, {"name": "ToTensor"}]
    assert _default_transforms(big) == [
        {"name": "Resize", "size": 256},
        {"name": "CenterCrop", "size": 224},
        {"name": "ToTensor"},
    ]
    derived, split = monitor_split_config(cfg, cfg.HOOKS.ONLINE_KNN.QUERY, "k")
    assert split == "TEST" and derived.DATA.TEST.DATA_SOURCES == ["digits"]
    assert derived.DATA.TEST.LABEL_TYPE == "standard"


@pytest.mark.parametrize(
    "override,key",
    [
        ("config.HOOKS.ONLINE_KNN.TOPK=0", "config.HOOKS.ONLINE_KNN.TOPK"),
        ("config.HOOKS.ONLINE_KNN.SIGMA=-1", "config.HOOKS.ONLINE_KNN.SIGMA"),
        (
            "config.HOOKS.ONLINE_KNN.BANK_REFRESH_PHASES=0",
            "config.HOOKS.ONLINE_KNN.BANK_REFRESH_PHASES",
        ),
        ("config.HOOKS.ONLINE_KNN.QUERY.SPLIT=val", "config.HOOKS.ONLINE_KNN.QUERY.SPLIT"),
        ("config.HOOKS.ONLINE_KNN.CACHE_INPUTS_MB=-1", "config.HOOKS.ONLINE_KNN.CACHE_INPUTS_MB"),
    ],
)
def test_config_errors_name_the_key(tmp_path, override: str, key: str) -> None:
    cfg = _cfg(tmp_path, override)
    with pytest.raises(ConfigError) as err:
        OnlineKnnHook.from_config(cfg)
    assert err.value.key_path == key


def test_queries_never_read_the_train_paths(tmp_path) -> None:
    cfg = _cfg(
        tmp_path,
        "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
        f"config.DATA.TRAIN.DATA_PATHS=[{tmp_path}]",
    )
    with pytest.raises(ConfigError) as err:
        monitor_split_config(cfg, cfg.HOOKS.ONLINE_KNN.QUERY, "config.HOOKS.ONLINE_KNN.QUERY")
    assert err.value.key_path == "config.HOOKS.ONLINE_KNN.QUERY.DATA_PATHS"


def test_data_without_labels_is_a_config_error(tmp_path, monkeypatch) -> None:
    from vissl.data.data_sources.digits import DigitsDataset
    from vissl.hooks.online_monitors import _FeatureSet

    cfg = _cfg(tmp_path)
    hook = OnlineKnnHook.from_config(cfg)
    monkeypatch.setattr(DigitsDataset, "get_labels", lambda self: None)
    with pytest.raises(ConfigError) as err:
        _FeatureSet(cfg, hook.bank_spec, "config.HOOKS.ONLINE_KNN.BANK", 0, 0)
    assert err.value.key_path == "config.HOOKS.ONLINE_KNN.BANK.LABEL_SOURCES"


# ---------------------------------------------------------------------- a run
def _hand_features(task, cfg, spec_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Trunk features of a monitor split, computed here: the dataset in index order."""
    from vissl.data import build_dataset

    derived, split = monitor_split_config(cfg, cfg.HOOKS.ONLINE_KNN[spec_name], "k")
    ds = build_dataset(derived, split)
    xs = torch.stack([ds[i]["data"][0] for i in range(len(ds))])
    model = task.base_model.eval()
    with torch.no_grad():
        feats = model.trunk(xs)
    feats = feats[0] if isinstance(feats, list) else feats
    return feats.flatten(1), torch.as_tensor(ds.get_labels())


@pytest.fixture(scope="module")
def knn_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("knn_run")
    cfg = _cfg(folder, "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=true")
    hooks = default_hook_generator(cfg)
    task = train_in_process(cfg, hooks)
    return folder, cfg, task, hooks


def test_run_logs_the_knn_everywhere(knn_run) -> None:
    folder = knn_run[0]
    metrics = [json.loads(line) for line in open(folder / "metrics.json")]
    assert len(metrics) == 3
    for rec in metrics:
        value = rec["train_online_knn"]
        assert set(value) == {"top_1", "top_5"} and 0 <= value["top_1"] <= 100
    phase_end = [json.loads(line) for line in open(folder / "stdout.json") if '"phase_end"' in line]
    assert [r["train_online_knn_top_1"] for r in phase_end] == [
        r["train_online_knn"]["top_1"] for r in metrics
    ]
    summary = json.load(open(folder / "summary.json"))
    final = summary["train"]["final"]["metrics"]
    assert final["train_online_knn_top_1"] == metrics[-1]["train_online_knn"]["top_1"]
    assert "train_online_knn_top_1" in summary["train"]["best"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert "Meters/train_online_knn/top_1/0" in scalars
    tb = [e.value for e in events.Scalars("Meters/train_online_knn/top_1/0")]
    assert tb == pytest.approx([r["train_online_knn"]["top_1"] for r in metrics])


def test_last_value_is_the_knn_of_the_final_model(knn_run) -> None:
    folder, cfg, task, hooks = knn_run
    (hook,) = [h for h in hooks if isinstance(h, OnlineKnnHook)]
    xb, yb = _hand_features(task, cfg, "BANK")
    xq, yq = _hand_features(task, cfg, "QUERY")
    assert len(xb) == 96 and len(xq) == 40
    offline = knn_classify(xb, yb, xq, yq, k=20, sigma=0.07)
    assert hook.values["top_1"] == pytest.approx(offline.top1)
    assert hook.values["top_5"] == pytest.approx(offline.top5)
    assert os.path.isfile(folder / "model_final_checkpoint_phase2.torch")


def test_early_stopping_on_the_knn(tmp_path) -> None:
    cfg = _cfg(
        tmp_path,
        "config.HOOKS.EARLY_STOPPING.ENABLE=true",
        "config.HOOKS.EARLY_STOPPING.MONITOR=train_online_knn_top_1",
        "config.HOOKS.EARLY_STOPPING.MODE=max",
        "config.HOOKS.EARLY_STOPPING.PATIENCE=1",
        "config.HOOKS.EARLY_STOPPING.MIN_DELTA=1000",
    )
    task = train_in_process(cfg, default_hook_generator(cfg))
    assert task.end_reason == "early_stop"
    assert task.train_phase_idx == 1  # phase 0 sets the best, phase 1 does not beat it
    assert "train_online_knn_top_1" in task.stop_training_reason


def test_test_phases_keep_their_own_meters(tmp_path) -> None:
    """With test phases between the train phases, the monitor reports after train phases
    only, and the test phases' records hold their own meters alone."""
    from tests._tiny_run import tiny_config

    resize = "[{name: Resize, size: 16}, {name: ToTensor}]"
    cfg = tiny_config(
        tmp_path,
        "config.HOOKS.ONLINE_KNN.USE=true",
        "config.HOOKS.ONLINE_KNN.BANK.DATA_LIMIT=48",
        "config.HOOKS.ONLINE_KNN.QUERY.DATA_LIMIT=24",
        f"config.HOOKS.ONLINE_KNN.BANK.TRANSFORMS={resize}",
        f"config.HOOKS.ONLINE_KNN.QUERY.TRANSFORMS={resize}",
    )
    train_in_process(cfg, default_hook_generator(cfg))
    records = [json.loads(line) for line in open(tmp_path / "metrics.json")]
    assert [("train_loss" in r, "test_loss" in r) for r in records] == [
        (True, False),
        (False, True),
    ] * 2
    for r in records:
        assert ("train_online_knn" in r) == ("train_loss" in r)
        assert not any(k.startswith("test_online") for k in r)
    assert "test_accuracy_list_meter" in records[1]

"""HOOKS.COLLAPSE_MONITOR: RankMe and the normalised std against numpy written from the
paper (Garrido et al. 2023), collapse cases, the phase's first NUM_EMBEDDINGS kept in the
buffer, 2 gloo ranks against 1 process on the gathered rows, config errors, and the
values of a short run in metrics.json and stdout.json."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests._tiny_run import train_in_process
from vissl.errors import ConfigError
from vissl.hooks import default_hook_generator
from vissl.hooks.online_monitors import CollapseMonitorHook, normalized_std, rankme
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo


def _np_rankme(z: np.ndarray, eps: float = 1e-7) -> float:
    s = np.linalg.svd(z, compute_uv=False)
    p = s / np.sum(np.abs(s)) + eps
    return float(np.exp(-np.sum(p * np.log(p))))


def _np_std(z: np.ndarray) -> float:
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    return float(np.std(z, axis=0, ddof=1).mean())


def test_rankme_and_std_match_numpy() -> None:
    z = torch.randn(50, 16, generator=torch.Generator().manual_seed(0))
    assert rankme(z).item() == pytest.approx(_np_rankme(z.double().numpy()), rel=1e-9)
    assert normalized_std(z).item() == pytest.approx(_np_std(z.double().numpy()), rel=1e-9)
    # isotropic: RankMe near the full rank, std near 1/sqrt(d)
    big = torch.randn(4000, 16, generator=torch.Generator().manual_seed(1))
    assert rankme(big).item() > 15
    assert normalized_std(big).item() == pytest.approx(1 / math.sqrt(16), rel=0.05)


def test_collapse_is_seen() -> None:
    g = torch.Generator().manual_seed(2)
    line = torch.randn(100, 1, generator=g).abs() @ torch.randn(1, 32, generator=g)
    assert rankme(line).item() == pytest.approx(1.0, abs=1e-3)
    assert normalized_std(line).item() == pytest.approx(0.0, abs=1e-6)
    low = torch.randn(100, 3, generator=g) @ torch.randn(3, 32, generator=g)
    assert 1.5 < rankme(low).item() <= 3.0 + 1e-6


def _feed(hook: CollapseMonitorHook, batches: list[torch.Tensor]) -> None:
    hook.reset_phase()
    for b in batches:
        task = SimpleNamespace(train=True, last_batch=SimpleNamespace(model_output=[b]))
        hook.on_forward(task)


def _batches(rank: int, n: int = 4, rows: int = 7) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rank)
    return [torch.randn(rows, 5, generator=g) for _ in range(n)]


def test_the_first_embeddings_of_the_phase_are_kept() -> None:
    hook = CollapseMonitorHook(num_embeddings=10)
    batches = _batches(0)
    _feed(hook, batches)
    kept = torch.cat(batches)[:10]
    assert hook.filled == 10 and torch.equal(hook.buffer, kept)
    hook.phase_end_sync()
    assert hook.values["rankme"] == pytest.approx(_np_rankme(kept.double().numpy()))
    assert hook.values["std"] == pytest.approx(_np_std(kept.double().numpy()))
    state = hook.phase_state()
    other = CollapseMonitorHook(num_embeddings=10)
    other.load_phase_state(state)
    other.phase_end_sync()
    assert other.values == hook.values


def _rank_worker(rank: int, world: int) -> dict[str, float]:
    hook = CollapseMonitorHook(num_embeddings=20)  # 10 per rank
    _feed(hook, _batches(rank))
    hook.phase_end_sync()
    return hook.values


def test_two_ranks_match_one_process_on_the_gathered_rows() -> None:
    results = spawn_gloo(_rank_worker, 2)
    rows = torch.cat([torch.cat(_batches(r))[:10] for r in range(2)]).double().numpy()
    for values in results:
        assert values["rankme"] == pytest.approx(_np_rankme(rows), rel=1e-9)
        assert values["std"] == pytest.approx(_np_std(rows), rel=1e-9)
    assert results[0] == results[1]


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"num_embeddings": 1}, "NUM_EMBEDDINGS"),
        ({"feature": "neck"}, "FEATURE"),
    ],
)
def test_config_errors_name_the_key(kwargs, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        CollapseMonitorHook(**kwargs)
    assert err.value.key_path == f"config.HOOKS.COLLAPSE_MONITOR.{key}"


@pytest.mark.parametrize("feature,dim", [("heads", 64), ("trunk", 256)])
def test_a_run_logs_rankme_and_std(tmp_path, feature: str, dim: int) -> None:
    _, cfg = hydra_compose_and_validate(
        [
            "config=quick_start",
            f"config.CHECKPOINT.DIR={tmp_path}",
            "config.DATA.NUM_DATALOADER_WORKERS=0",
            "config.DATA.TRAIN.DATA_LIMIT=64",
            "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=16",
            "config.OPTIMIZER.num_epochs=2",
            "config.HOOKS.PROGRESS_BAR=false",
            "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=false",
            "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=false",
            "config.HOOKS.COLLAPSE_MONITOR.USE=true",
            "config.HOOKS.COLLAPSE_MONITOR.NUM_EMBEDDINGS=48",
            f"config.HOOKS.COLLAPSE_MONITOR.FEATURE={feature}",
        ]
    )
    hooks = default_hook_generator(cfg)
    train_in_process(cfg, hooks)
    (hook,) = [h for h in hooks if isinstance(h, CollapseMonitorHook)]
    assert hook.buffer is not None and hook.buffer.shape == (48, dim)
    metrics = [json.loads(line) for line in open(tmp_path / "metrics.json")]
    records = [json.loads(line) for line in open(tmp_path / "stdout.json")]
    ends = [r for r in records if r.get("phase_end")]
    assert len(metrics) == len(ends) == 2
    for m, r in zip(metrics, ends, strict=True):
        value = m["train_collapse_monitor"]
        assert 1.0 <= value["rankme"] <= 48 and 0 < value["std"] < 1
        assert r["train_collapse_monitor_rankme"] == value["rankme"]
        assert r["train_collapse_monitor_std"] == value["std"]

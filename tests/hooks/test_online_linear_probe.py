"""HOOKS.ONLINE_LINEAR_PROBE: one SGD step against the softmax cross-entropy written by
hand, 2 gloo ranks on halves of a batch against 1 process on all of it, the label table
of LABEL_TYPE sample_index, config errors; with every monitor on: the same trained
weights as without monitors, and an exact resume from an iteration checkpoint (weights,
probe, monitor values)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests._tiny_run import train_in_process
from vissl.errors import ConfigError
from vissl.hooks import default_hook_generator
from vissl.hooks.online_monitors import LinearProbe, OnlineLinearProbeHook
from vissl.utils.checkpoint import load_checkpoint
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo

DIM, CLASSES, BATCH = 6, 7, 12
LR, MOMENTUM, WD = 0.5, 0.9, 0.01


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, DIM, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def _probe() -> LinearProbe:
    return LinearProbe(
        DIM, CLASSES, lr=LR, momentum=MOMENTUM, weight_decay=WD, seed=0, device=torch.device("cpu")
    )


def test_one_step_is_sgd_on_the_cross_entropy_written_by_hand() -> None:
    probe = _probe()
    w = probe.layer.weight.detach().double().numpy().copy()
    b = probe.layer.bias.detach().double().numpy().copy()
    x, y = _batch(0)
    xn, yn = x.double().numpy(), y.numpy()
    logits = xn @ w.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    loss = -np.log(p[np.arange(BATCH), yn]).mean()
    d = p.copy()
    d[np.arange(BATCH), yn] -= 1
    d /= BATCH
    gw, gb = d.T @ xn + WD * w, d.sum(0) + WD * b  # first step: momentum buffer = grad
    probe.step(x, y)
    assert np.allclose(probe.layer.weight.detach().numpy(), w - LR * gw, atol=1e-6)
    assert np.allclose(probe.layer.bias.detach().numpy(), b - LR * gb, atol=1e-6)
    top1 = int((logits.argmax(1) == yn).sum())
    top5 = int(sum(yn[i] in np.argsort(-logits[i])[:5] for i in range(BATCH)))
    c = probe.counts.tolist()
    assert c[:3] == [top1, top5, BATCH]
    assert c[3] == pytest.approx(loss * BATCH, rel=1e-5)


def _rank_worker(rank: int, world: int) -> tuple[list, list]:
    probe = _probe()
    half = BATCH // world
    for step in range(3):
        x, y = _batch(step)
        probe.step(x[rank * half : (rank + 1) * half], y[rank * half : (rank + 1) * half])
    counts = probe.counts.clone()
    torch.distributed.all_reduce(counts)
    return [p.detach().clone() for p in probe.layer.parameters()], counts.tolist()


def test_two_ranks_hold_the_probe_of_one_process_on_the_whole_batch() -> None:
    results = spawn_gloo(_rank_worker, 2)
    single = _probe()
    for step in range(3):
        single.step(*_batch(step))
    for params, counts in results:
        for mine, ref in zip(params, single.layer.parameters(), strict=True):
            assert torch.allclose(mine, ref.detach(), atol=1e-6)
        assert counts[:3] == single.counts.tolist()[:3]
        assert counts[3] == pytest.approx(single.counts.tolist()[3], rel=1e-5)
    for a, b in zip(results[0][0], results[1][0], strict=True):
        assert torch.equal(a, b)  # every rank holds exactly the same probe


# ---------------------------------------------------------------------- config
def _cfg(folder, *overrides: str):
    _, cfg = hydra_compose_and_validate(
        [
            "config=quick_start",
            f"config.CHECKPOINT.DIR={folder}",
            "config.DATA.NUM_DATALOADER_WORKERS=0",
            "config.DATA.TRAIN.DATA_LIMIT=64",
            "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=16",
            "config.OPTIMIZER.num_epochs=3",
            "config.LOG_FREQUENCY=2",
            "config.HOOKS.PROGRESS_BAR=false",
            "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=false",
            "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=false",
            "config.CHECKPOINT.AUTO_RESUME=false",
            *overrides,
        ]
    )
    return cfg


MONITORS = [
    "config.HOOKS.ONLINE_KNN.USE=true",
    "config.HOOKS.ONLINE_KNN.BANK.DATA_LIMIT=64",
    "config.HOOKS.ONLINE_KNN.QUERY.DATA_LIMIT=32",
    "config.HOOKS.ONLINE_KNN.BANK_REFRESH_PHASES=2",
    "config.HOOKS.ONLINE_LINEAR_PROBE.USE=true",
    "config.HOOKS.COLLAPSE_MONITOR.USE=true",
    "config.HOOKS.COLLAPSE_MONITOR.NUM_EMBEDDINGS=40",
]


@pytest.mark.parametrize(
    "override,key",
    [
        ("FEATURE=neck", "FEATURE"),
        ("LR=0", "LR"),
        ("MOMENTUM=1.0", "MOMENTUM"),
        ("WEIGHT_DECAY=-1", "WEIGHT_DECAY"),
        ("NUM_CLASSES=1", "NUM_CLASSES"),
    ],
)
def test_config_errors_name_the_key(tmp_path, override: str, key: str) -> None:
    cfg = _cfg(tmp_path, f"config.HOOKS.ONLINE_LINEAR_PROBE.{override}")
    with pytest.raises(ConfigError) as err:
        OnlineLinearProbeHook.from_config(cfg)
    assert err.value.key_path == f"config.HOOKS.ONLINE_LINEAR_PROBE.{key}"


def test_label_type_zero_is_a_config_error(tmp_path) -> None:
    cfg = _cfg(tmp_path, "config.DATA.TRAIN.LABEL_TYPE=zero")
    hook = OnlineLinearProbeHook.from_config(cfg)
    from vissl.data import build_dataset

    task = SimpleNamespace(
        device=torch.device("cpu"), meters=[], datasets={"TRAIN": build_dataset(cfg, "TRAIN")}
    )
    with pytest.raises(ConfigError) as err:
        hook.on_start(task)
    assert err.value.key_path == "config.HOOKS.ONLINE_LINEAR_PROBE.USE"


# ---------------------------------------------------------------------- runs
def _weights(task) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in task.base_model.state_dict().items()}


def _metrics(folder) -> list[dict]:
    return [json.loads(line) for line in open(folder / "metrics.json")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    plain_dir = tmp_path_factory.mktemp("plain")
    mon_dir = tmp_path_factory.mktemp("monitored")
    plain = train_in_process(_cfg(plain_dir), default_hook_generator(_cfg(plain_dir)))
    cfg = _cfg(mon_dir, *MONITORS, "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=6")
    hooks = default_hook_generator(cfg)
    monitored = train_in_process(cfg, hooks)
    return plain, monitored, hooks, mon_dir


def test_the_probe_learns_with_the_labels_looked_up(runs) -> None:
    _, task, hooks, folder = runs
    (probe,) = [h for h in hooks if isinstance(h, OnlineLinearProbeHook)]
    # quick_start's targets are sample indices: the probe reads the digits' labels
    from vissl.data.data_sources.digits import _load_digits, digits_split_indices

    ds = task.datasets["TRAIN"]
    expected = _load_digits()[1][digits_split_indices()["TRAIN"]][ds.sub_set]
    assert torch.equal(probe.label_table.cpu(), torch.as_tensor(expected))
    assert probe.num_classes == 10
    values = [m["train_online_linear_probe"] for m in _metrics(folder)]
    assert len(values) == 3 and all(0 <= v["top_1"] <= 100 for v in values)
    assert probe.probe is not None and probe.probe.counts[2].item() == 64 * 2  # 2 views


def test_monitors_do_not_change_training(runs) -> None:
    plain, monitored, _, _ = runs
    a, b = _weights(plain), _weights(monitored)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_inside_a_phase_is_exact(runs, tmp_path) -> None:
    _, full, full_hooks, full_dir = runs
    cfg = _cfg(tmp_path, *MONITORS)
    hooks = default_hook_generator(cfg)
    resumed = train_in_process(cfg, hooks, checkpoint_path=str(full_dir / "model_iteration6.torch"))
    a, b = _weights(full), _weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    (pa,) = [h for h in full_hooks if isinstance(h, OnlineLinearProbeHook)]
    (pb,) = [h for h in hooks if isinstance(h, OnlineLinearProbeHook)]
    for x, y in zip(pa.probe.layer.parameters(), pb.probe.layer.parameters(), strict=True):
        assert torch.equal(x, y)
    ma, mb = _metrics(full_dir)[1:], _metrics(tmp_path)
    assert [m["train_phase_idx"] for m in mb] == [1, 2]
    for x, y in zip(ma, mb, strict=True):
        assert x["train_online_linear_probe"] == y["train_online_linear_probe"]
        assert x["train_collapse_monitor"] == y["train_collapse_monitor"]
    # the bank is refilled at the resume and all of it after the last phase
    assert ma[-1]["train_online_knn"] == mb[-1]["train_online_knn"]
    # the probe's state is in the checkpoint
    state = load_checkpoint(str(full_dir / "model_iteration6.torch"))
    assert "probe" in state["classy_state_dict"]["hooks"]["OnlineLinearProbeHook"]

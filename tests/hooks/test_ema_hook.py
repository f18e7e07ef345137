"""``HOOKS.EMA_MODEL`` (:class:`~vissl.hooks.ema_hook.EmaHook`): the average, its schedule,
checkpoints and resume, loading it for evaluation, the EMA meters, and config errors.

The formula is checked on a small module driven by hand; the rest on the tiny in-memory
run (2 epochs of 4 steps, each followed by a 2-batch test phase).
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from tests._tiny_run import tiny_config, train_in_process
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.hooks import Priority, VisslHook, default_hook_generator
from vissl.hooks.ema_hook import EmaHook
from vissl.models import build_model
from vissl.models.momentum import copy_tensors_, ema_tensors, ema_update_tensors_
from vissl.trainer.task import SelfSupervisionTask
from vissl.utils.checkpoint import load_checkpoint
from vissl.utils.weights_init import init_model_from_weights_params_file

BOTH = [
    "config.HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True",
    "config.HOOKS.EMA_MODEL.ENABLE_EMA_METERS=True",
]
FINAL = "model_final_checkpoint_phase2.torch"


def _small() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def _drive(hook: EmaHook, model: nn.Module, steps: int) -> list[dict[str, torch.Tensor]]:
    """Train ``model`` for ``steps`` SGD steps, calling the hook as the trainer does.

    Returns the model's state (parameters and buffers) after each optimizer step.
    """
    task: Any = SimpleNamespace(base_model=model, device=torch.device("cpu"), iteration=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    hook.on_start(task)
    history = []
    for step in range(1, steps + 1):
        model.train()
        opt.zero_grad()
        model(torch.randn(8, 3) + step).pow(2).mean().backward()
        opt.step()
        hook.on_update(task)  # before the trainer counts the step, as in the train step
        task.iteration = step
        history.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return history


@pytest.mark.parametrize("update_iter", [1, 2, 3])
def test_the_average_follows_the_formula_every_update_iter_steps(update_iter: int) -> None:
    torch.manual_seed(0)
    model = _small()
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    hook = EmaHook(decay=0.7, update_iter=update_iter)
    history = _drive(hook, model, steps=7)

    expected = dict(start)
    params = {n for n, _ in model.named_parameters()}
    for step, state in enumerate(history, start=1):
        if step % update_iter == 0:  # steps k, 2k, ...
            expected = {
                k: 0.7 * expected[k] + 0.3 * state[k] if k in params else state[k] for k in state
            }
    assert hook.model is not None
    got = hook.model.state_dict()
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=1e-6, msg=k)
    # buffers are copied from the model at the last update, not averaged
    last = history[(7 // update_iter) * update_iter - 1]
    assert torch.equal(got["1.running_mean"], last["1.running_mean"])
    assert int(got["1.num_batches_tracked"]) == (7 // update_iter) * update_iter
    # the copy is frozen, in eval mode, and not the model's own tensors
    assert not any(p.requires_grad for p in hook.model.parameters())
    assert not hook.model.training
    assert hook.model[0].weight.data_ptr() != model[0].weight.data_ptr()


@pytest.mark.parametrize("update_iter", [1, 2])
def test_host_staged_average_equals_the_direct_one(update_iter: int) -> None:
    """#22 item 10: with the EMA on the CPU of a GPU model, an update is one flat
    non-blocking copy per dtype (HostSnapshot), folded in at the next update or when the
    EMA is read. Forced on here (CPU model): the average must be bitwise the direct one."""
    results = []
    for staged in (False, True):
        torch.manual_seed(0)
        model = _small()
        hook = EmaHook(decay=0.7, update_iter=update_iter, stage_on_host=staged)
        _drive(hook, model, steps=7)
        assert (hook._snapshot is not None) == staged
        results.append(hook.ema_state_dict())
    direct, staged_state = results
    assert direct is not None and staged_state is not None
    for k in direct:
        assert torch.equal(direct[k], staged_state[k]), k


def test_host_snapshot_copies_each_dtype_once_and_keeps_launch_time_values() -> None:
    from vissl.models.momentum import HostSnapshot

    tensors = [torch.ones(2, 3), torch.zeros(4, dtype=torch.int64), torch.full((5,), 2.0)]
    snap = HostSnapshot(tensors)
    assert len(snap._groups) == 2  # float32 and int64
    snap.launch()
    for t in tensors:
        t.add_(10)  # changes after the launch are not in the snapshot
    views = snap.wait()
    assert [v.shape for v in views] == [t.shape for t in tensors]
    assert torch.equal(views[0], torch.ones(2, 3)) and torch.equal(views[2], torch.full((5,), 2.0))
    assert views[1].dtype == torch.int64 and int(views[1].sum()) == 0


def test_update_iter_two_changes_the_average_after_even_steps_only() -> None:
    torch.manual_seed(0)
    hook = EmaHook(decay=0.5, update_iter=2)
    model = _small()
    task: Any = SimpleNamespace(base_model=model, device=torch.device("cpu"), iteration=0)
    hook.on_start(task)
    assert hook.model is not None
    changed = []
    for step in range(1, 7):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        before = hook.model[0].weight.clone()
        hook.on_update(task)
        task.iteration = step
        changed.append(not torch.equal(before, hook.model[0].weight))
    assert changed == [False, True, False, True, False, True]


def test_foreach_update_converts_a_target_of_another_dtype() -> None:
    source = _small()
    target = copy.deepcopy(source).double()
    old = [p.detach().clone() for p in target.parameters()]
    with torch.no_grad():
        for p in source.parameters():
            p.fill_(2.0)
        source[1].running_mean.fill_(3.0)
    ema_update_tensors_(ema_tensors(target, source), momentum=0.25)
    for p, p_old in zip(target.parameters(), old, strict=True):
        assert p.dtype == torch.float64
        torch.testing.assert_close(p, 0.25 * p_old + 0.75 * 2.0)
    assert torch.all(target[1].running_mean == 3.0)
    copy_tensors_([], [])  # nothing to copy is fine


def test_a_model_that_differs_from_the_copy_is_refused() -> None:
    with pytest.raises(ValueError, match="differ in their parameters"):
        ema_tensors(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))


# ---------------------------------------------------------------------- config
@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> AttrDict:
    return tiny_config(tmp_path_factory.mktemp("cfg"))


def _with(cfg: AttrDict, **ema: Any) -> AttrDict:
    out = copy.deepcopy(cfg)
    for key, value in ema.items():
        out.HOOKS.EMA_MODEL[key] = value
    return out


def test_the_hook_is_absent_unless_a_flag_is_set(cfg: AttrDict) -> None:
    assert not any(isinstance(h, EmaHook) for h in default_hook_generator(cfg))
    for flag in ("SAVE_EMA_MODEL", "ENABLE_EMA_METERS"):
        hooks = [
            h for h in default_hook_generator(_with(cfg, **{flag: True})) if isinstance(h, EmaHook)
        ]
        assert len(hooks) == 1
        assert hooks[0].decay == 0.9999 and hooks[0].update_iter == 1
        assert hooks[0].ema_device == "gpu"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("DECAY", 1.5),
        ("DECAY", -0.1),
        ("DECAY", "high"),
        ("DECAY", True),
        ("UPDATE_ITER", 0),
        ("UPDATE_ITER", -2),
        ("UPDATE_ITER", 1.5),
        ("EMA_DEVICE", "tpu"),
        ("EMA_DEVICE", 3),
    ],
)
def test_bad_values_raise_config_errors_naming_the_key(cfg: AttrDict, key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"config.HOOKS.EMA_MODEL.{key}") as err:
        default_hook_generator(_with(cfg, SAVE_EMA_MODEL=True, **{key: value}))
    assert err.value.key_path == f"config.HOOKS.EMA_MODEL.{key}"


@pytest.mark.parametrize(("value", "device"), [("cuda", "gpu"), ("GPU", "gpu"), ("CPU", "cpu")])
def test_device_names(cfg: AttrDict, value: str, device: str) -> None:
    assert (
        EmaHook.from_config(_with(cfg, SAVE_EMA_MODEL=True, EMA_DEVICE=value)).ema_device == device
    )


def test_ema_meters_need_meters(cfg: AttrDict) -> None:
    bare = _with(cfg, ENABLE_EMA_METERS=True)
    bare.METERS.names = []
    with pytest.raises(ConfigError, match="METERS.names is empty") as err:
        EmaHook.from_config(bare)
    assert err.value.key_path == "config.HOOKS.EMA_MODEL.ENABLE_EMA_METERS"


# ---------------------------------------------------------------------- runs
class StopAt(VisslHook):
    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def on_step(self, task: SelfSupervisionTask) -> None:
        if task.train and task.iteration == self.iteration:
            task.stop_training = True


class WatchEma(VisslHook):
    """Records the EMA's first weight after every train step (iteration, changed?)."""

    priority = Priority.LOWEST

    def __init__(self) -> None:
        self.changes: list[tuple[int, bool]] = []
        self._last: torch.Tensor | None = None

    def on_step(self, task: SelfSupervisionTask) -> None:
        if not task.train:
            return
        (hook,) = [h for h in task.hooks if isinstance(h, EmaHook)]
        assert hook.model is not None
        now = next(hook.model.parameters()).detach().clone()
        self.changes.append(
            (task.iteration, self._last is None or not torch.equal(now, self._last))
        )
        self._last = now


def _run(
    folder: Any, *overrides: str, extra: tuple[Any, ...] = (), resume: str | None = None
) -> SelfSupervisionTask:
    cfg = tiny_config(folder, *overrides)
    return train_in_process(cfg, [*default_hook_generator(cfg), *extra], checkpoint_path=resume)


def _ema(task: SelfSupervisionTask) -> EmaHook:
    (hook,) = [h for h in task.hooks if isinstance(h, EmaHook)]
    return hook


def _records(folder: Any) -> list[dict[str, Any]]:
    text = (folder / "metrics.json").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    folder = tmp_path_factory.mktemp("full")
    task = _run(folder, *BOTH, "config.HOOKS.EMA_MODEL.DECAY=0.6")
    return SimpleNamespace(folder=folder, task=task)


def test_checkpoints_hold_the_ema_in_vissls_layout(full_run: SimpleNamespace) -> None:
    state = load_checkpoint(str(full_run.folder / FINAL))["classy_state_dict"]
    ema = state["ema_model"]["model"]
    assert set(ema) == {"trunk", "heads", "other"}
    model = _ema(full_run.task).model
    assert model is not None
    for k, v in model.state_dict().items():
        assert k.startswith(("trunk.", "heads."))
        part, name = k.split(".", 1)
        assert torch.equal(ema[part][name], v), k
    # the average is not the model
    base = state["base_model"]["model"]["trunk"]
    assert any(not torch.equal(base[k], ema["trunk"][k]) for k in base)


def test_resume_restores_the_average_exactly(full_run: SimpleNamespace, tmp_path: Any) -> None:
    overrides = (*BOTH, "config.HOOKS.EMA_MODEL.DECAY=0.6")
    _run(tmp_path, *overrides, extra=(StopAt(3),))
    assert (tmp_path / "model_iteration3.torch").exists()
    resumed = _run(tmp_path, *overrides, resume=str(tmp_path / "model_iteration3.torch"))
    assert resumed.iteration == full_run.task.iteration == 8
    a = _ema(full_run.task).model
    b = _ema(resumed).model
    assert a is not None and b is not None
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(va, vb), k
    # the EMA meters of the test phases agree too
    key = "test_ema_accuracy_list_meter"
    full = [r[key] for r in _records(full_run.folder) if key in r]
    again = [r[key] for r in _records(tmp_path) if key in r]
    assert len(full) == 2 and full == again


def test_weights_init_loads_the_average_into_a_fresh_model(full_run: SimpleNamespace) -> None:
    cfg = full_run.task.config
    ema = _ema(full_run.task).model
    assert ema is not None
    path = str(full_run.folder / FINAL)
    for key_name in ("ema_model", ["classy_state_dict", "ema_model"]):
        torch.manual_seed(123)
        fresh = build_model(cfg.MODEL, cfg.OPTIMIZER)
        weights = {"PARAMS_FILE": path, "STATE_DICT_KEY_NAME": key_name, "SKIP_LAYERS": []}
        report = init_model_from_weights_params_file(fresh, weights, cfg.MODEL)
        assert any(k.startswith("trunk.") for k in report.loaded)
        trunk = {k: v for k, v in ema.state_dict().items() if k.startswith("trunk.")}
        for k, v in fresh.state_dict().items():
            if k.startswith("trunk."):
                assert torch.equal(v, trunk[k]), k
    # the default key still gives the trained model, not the average
    fresh = build_model(cfg.MODEL, cfg.OPTIMIZER)
    init_model_from_weights_params_file(fresh, {"PARAMS_FILE": path, "SKIP_LAYERS": []}, cfg.MODEL)
    base = full_run.task.base_model.state_dict()
    assert all(torch.equal(v, base[k]) for k, v in fresh.state_dict().items())


def test_ema_meters_are_logged_beside_the_models_in_test_phases(full_run: SimpleNamespace) -> None:
    records = _records(full_run.folder)
    test = [r for r in records if "test_loss" in r]
    train = [r for r in records if "train_loss" in r]
    assert len(test) == 2 and all("test_ema_accuracy_list_meter" in r for r in test)
    assert not any(k.startswith("train_ema") for r in train for k in r)


def test_with_decay_zero_the_ema_meters_equal_the_models(tmp_path: Any) -> None:
    # DECAY 0: the average is the model after every step (buffers included), so the EMA
    # meters must measure exactly what the model's own meters measure.
    _run(
        tmp_path,
        "config.HOOKS.EMA_MODEL.ENABLE_EMA_METERS=True",
        "config.HOOKS.EMA_MODEL.DECAY=0.0",
    )
    test = [r for r in _records(tmp_path) if "test_loss" in r]
    assert len(test) == 2
    for r in test:
        assert r["test_ema_accuracy_list_meter"] == r["test_accuracy_list_meter"]
    # the EMA is saved whenever the hook is on (a resume needs it for the meters)
    assert "ema_model" in load_checkpoint(str(tmp_path / FINAL))["classy_state_dict"]


def test_with_gradient_accumulation_updates_count_optimizer_steps(tmp_path: Any) -> None:
    watch = WatchEma()
    task = _run(
        tmp_path,
        "config.HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True",
        "config.HOOKS.EMA_MODEL.UPDATE_ITER=2",
        "config.HOOKS.EMA_MODEL.DECAY=0.5",
        "config.OPTIMIZER.GRAD_ACCUMULATION_STEPS=2",
        "config.TEST_MODEL=False",
        extra=(watch,),
    )
    assert task.iteration == 4  # 2 epochs of 2 optimizer steps (4 micro-batches each)
    # the first record compares with nothing; after it, only even optimizer steps change it
    assert watch.changes[1:] == [(2, True), (3, False), (4, True)]

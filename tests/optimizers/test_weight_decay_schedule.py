"""``OPTIMIZER.param_schedulers.weight_decay`` and ``weight_decay_head``: which groups follow
them, values, resume, errors."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch import nn

from tests._vissl_configs import needs_vissl_configs
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError, UnknownKeyError, UnknownNameError
from vissl.optimizers import build_optimizer, build_param_schedulers
from vissl.optimizers.lars import LARS
from vissl.optimizers.param_scheduler import ParamSchedulerSet
from vissl.utils.hydra_config import hydra_compose_and_validate

WD_COSINE = {"name": "cosine", "start_value": 0.04, "end_value": 0.4}
WD_HEAD_LINEAR = {"name": "linear", "start_value": 0.1, "end_value": 0.0}
WHERES = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]


def _cosine(start: float, end: float, where: float) -> float:
    return end + 0.5 * (start - end) * (1 + math.cos(math.pi * where))


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU())
        self.heads = nn.ModuleList([nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads[0](self.trunk(x))


def _opt_cfg(
    weight_decay_schedule: object = None, head_schedule: object = None, **overrides: object
) -> AttrDict:
    schedules: dict = {"lr": {"name": "cosine", "start_value": 0.1, "end_value": 0.0}}
    if weight_decay_schedule is not None:
        schedules["weight_decay"] = weight_decay_schedule
    if head_schedule is not None:
        schedules["weight_decay_head"] = head_schedule
    cfg = {
        "name": "sgd",
        "use_larc": False,
        "weight_decay": 1e-4,
        "momentum": 0.9,
        "nesterov": False,
        "num_epochs": 10,
        "regularize_bn": False,
        "regularize_bias": True,
        "non_regularized_parameters": [],
        "head_optimizer_params": {
            "use_different_lr": False,
            "use_different_wd": False,
            "weight_decay": 0.5,
        },
        "param_schedulers": schedules,
        "construct_single_param_group_only": False,
    }
    cfg.update(overrides)
    return AttrDict(cfg)


def _build(cfg: AttrDict) -> tuple[ParamSchedulerSet, torch.optim.Optimizer]:
    schedules = build_param_schedulers(cfg, batch_size_per_replica=8, world_size=1)
    return schedules, build_optimizer(cfg, TinyModel(), param_schedulers=schedules)


def _wd(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    return {g["param_group_name"]: g["weight_decay"] for g in optimizer.param_groups}


def test_regularized_groups_follow_the_cosine() -> None:
    schedules, optimizer = _build(_opt_cfg(WD_COSINE))
    assert schedules.has_weight_decay and schedules.update_interval("weight_decay") == "step"
    assert schedules.names == ["lr", "lr_head", "weight_decay"]
    # built at where = 0
    assert _wd(optimizer)["trunk_regularized"] == pytest.approx(0.04, abs=1e-12)
    for where in WHERES:
        schedules.apply(optimizer, where, "step")
        expected = _cosine(0.04, 0.4, min(where, 1 - 1e-6))
        wd = _wd(optimizer)
        assert wd["trunk_regularized"] == pytest.approx(expected, abs=1e-6), where
        assert wd["head_regularized"] == pytest.approx(expected, abs=1e-6), where
        assert wd["trunk_unregularized"] == 0.0 and wd["head_unregularized"] == 0.0
        lr = {g["param_group_name"]: g["lr"] for g in optimizer.param_groups}
        assert lr["trunk_regularized"] == pytest.approx(_cosine(0.1, 0.0, where), abs=1e-6)
    assert schedules.values(0.5)["weight_decay"] == pytest.approx(0.22)


def test_head_with_its_own_weight_decay_keeps_it() -> None:
    cfg = _opt_cfg(
        WD_COSINE,
        head_optimizer_params={"use_different_wd": True, "weight_decay": 0.5},
    )
    schedules, optimizer = _build(cfg)
    for where in WHERES:
        schedules.apply(optimizer, where, None)
        wd = _wd(optimizer)
        assert wd["head_regularized"] == 0.5 and wd["head_unregularized"] == 0.0
        assert wd["trunk_regularized"] == pytest.approx(
            _cosine(0.04, 0.4, min(where, 1 - 1e-6)), abs=1e-6
        )


def test_single_group_follows_the_schedule() -> None:
    schedules, optimizer = _build(_opt_cfg(WD_COSINE, construct_single_param_group_only=True))
    schedules.apply(optimizer, 0.5, "step")
    assert _wd(optimizer) == {"all": pytest.approx(0.22)}


def test_schedule_overrides_a_zero_configured_weight_decay() -> None:
    # As VISSL: the schedule replaces OPTIMIZER.weight_decay for the regularized groups.
    schedules, optimizer = _build(_opt_cfg(WD_COSINE, weight_decay=0.0))
    schedules.apply(optimizer, 0.5, "step")
    wd = _wd(optimizer)
    assert wd["trunk_regularized"] == pytest.approx(0.22) and wd["trunk_unregularized"] == 0.0


def test_update_interval_epoch() -> None:
    schedules, optimizer = _build(_opt_cfg({**WD_COSINE, "update_interval": "epoch"}))
    schedules.apply(optimizer, 0.5, "step")
    assert _wd(optimizer)["trunk_regularized"] == pytest.approx(0.04)  # not due
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)  # lr is per step
    schedules.apply(optimizer, 0.5, "epoch")
    assert _wd(optimizer)["trunk_regularized"] == pytest.approx(0.22)


def test_other_schedulers_and_composite() -> None:
    composite = {
        "name": "composite",
        "schedulers": [
            {"name": "linear", "start_value": 0.0, "end_value": 0.1},
            {"name": "constant", "value": 0.1},
        ],
        "lengths": [0.5, 0.5],
        "interval_scaling": ["rescaled", "fixed"],
    }
    schedules, optimizer = _build(_opt_cfg(composite))
    assert _wd(optimizer)["trunk_regularized"] == 0.0  # starts at 0, still regularized
    schedules.apply(optimizer, 0.25, "step")
    assert _wd(optimizer)["trunk_regularized"] == pytest.approx(0.05)
    schedules.apply(optimizer, 0.75, "step")
    assert _wd(optimizer)["trunk_regularized"] == pytest.approx(0.1)


def test_without_the_key_nothing_changes() -> None:
    schedules, optimizer = _build(_opt_cfg())
    assert not schedules.has_weight_decay and schedules.names == ["lr", "lr_head"]
    before = _wd(optimizer)
    for where in WHERES:
        schedules.apply(optimizer, where, None)
    assert (
        _wd(optimizer)
        == before
        == {
            "trunk_regularized": 1e-4,
            "trunk_unregularized": 0.0,
            "head_regularized": 1e-4,
            "head_unregularized": 0.0,
        }
    )
    assert "weight_decay" not in schedules.values(0.3)


@pytest.mark.parametrize("head", [None, "weight_decay_head"])
@pytest.mark.parametrize("name", ["sgd", "lars"])
def test_resume_is_exact(name: str, head: str | None) -> None:
    """The schedules are functions of ``where``: a restarted run gets the same values
    (``weight_decay_head`` too, evaluated at the same ``where``)."""
    torch.manual_seed(0)
    cfg = _opt_cfg(WD_COSINE, WD_HEAD_LINEAR if head else None, name=name)
    steps = 6
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randn(8, 4, generator=gen) for _ in range(steps)]

    def train(
        model: nn.Module,
        schedules: ParamSchedulerSet,
        optimizer: torch.optim.Optimizer,
        first: int,
        last: int,
    ) -> None:
        for i in range(first, last):
            schedules.apply(optimizer, i / steps, "step")
            optimizer.zero_grad(set_to_none=True)
            (model(batches[i]) ** 2).mean().backward()
            optimizer.step()

    base = TinyModel()
    straight = copy.deepcopy(base)
    schedules = build_param_schedulers(cfg, batch_size_per_replica=8, world_size=1)
    optimizer = build_optimizer(cfg, straight, param_schedulers=schedules)
    if name == "lars":
        assert isinstance(optimizer, LARS)
    train(straight, schedules, optimizer, 0, steps)

    half = copy.deepcopy(base)
    first_opt = build_optimizer(cfg, half, param_schedulers=schedules)
    train(half, schedules, first_opt, 0, steps // 2)
    model_state = copy.deepcopy(half.state_dict())
    opt_state = copy.deepcopy(first_opt.state_dict())

    restarted = TinyModel()
    restarted.load_state_dict(model_state)
    new_schedules = build_param_schedulers(cfg, batch_size_per_replica=8, world_size=1)
    second_opt = build_optimizer(cfg, restarted, param_schedulers=new_schedules)
    second_opt.load_state_dict(opt_state)
    train(restarted, new_schedules, second_opt, steps // 2, steps)

    for (pname, p), q in zip(straight.named_parameters(), restarted.parameters()):
        assert torch.equal(p, q), pname
    assert _wd(optimizer) == _wd(second_opt)
    if head:
        last = (steps - 1) / steps
        assert _wd(second_opt)["head_regularized"] == pytest.approx(0.1 * (1 - last))
        assert new_schedules.values(last) == schedules.values(last)


@pytest.mark.parametrize(
    ("schedule", "key"),
    [
        ({"name": "cosine", "start_value": 0.04}, "weight_decay.end_value"),
        ({"name": "cosine", "start_value": -0.04, "end_value": 0.4}, "weight_decay.start_value"),
        ({"name": "multistep", "values": [0.1, -0.1], "milestones": [5]}, "weight_decay.values"),
        (0.04, "weight_decay"),
        ({**WD_COSINE, "update_interval": "batch"}, "weight_decay.update_interval"),
        (
            {**WD_COSINE, "auto_lr_scaling": {"auto_scale": True, "base_value": 0.04}},
            "weight_decay.auto_lr_scaling.auto_scale",
        ),
    ],
)
def test_bad_schedule_names_the_key(schedule: object, key: str) -> None:
    full = f"config.OPTIMIZER.param_schedulers.{key}"
    with pytest.raises(ConfigError) as info:
        build_param_schedulers(_opt_cfg(schedule), batch_size_per_replica=8, world_size=1)
    assert info.value.key_path == full
    assert full in str(info.value)
    # the same schedule as weight_decay_head: the same error, under its own key
    full = full.replace(".weight_decay", ".weight_decay_head", 1)
    with pytest.raises(ConfigError) as info:
        build_param_schedulers(
            _opt_cfg(head_schedule=schedule), batch_size_per_replica=8, world_size=1
        )
    assert info.value.key_path == full
    assert full in str(info.value)


def test_bad_schedule_is_caught_by_build_optimizer_too() -> None:
    with pytest.raises(ConfigError) as info:
        build_optimizer(_opt_cfg({"name": "cosine", "start_value": 0.04}), TinyModel())
    assert info.value.key_path == "config.OPTIMIZER.param_schedulers.weight_decay.end_value"


def test_unknown_scheduler_name_names_the_key() -> None:
    with pytest.raises(UnknownNameError) as info:
        build_param_schedulers(
            _opt_cfg({"name": "cosinus", "start_value": 0.0, "end_value": 1.0}),
            batch_size_per_replica=8,
            world_size=1,
        )
    assert "config.OPTIMIZER.param_schedulers.weight_decay.name" in str(info.value)


def test_unknown_schedule_key_is_refused() -> None:
    cfg = _opt_cfg()
    cfg["param_schedulers"]["weight_decy"] = WD_COSINE
    with pytest.raises(UnknownKeyError) as info:
        build_param_schedulers(cfg, batch_size_per_replica=8, world_size=1)
    assert info.value.key_path == "config.OPTIMIZER.param_schedulers.weight_decy"
    assert "'weight_decay'" in str(info.value)


def test_composed_config_is_accepted_without_warnings() -> None:
    overrides = [
        "config=quick_start",
        *(f"+config.OPTIMIZER.param_schedulers.weight_decay.{k}={v}" for k, v in WD_COSINE.items()),
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, cfg = hydra_compose_and_validate(overrides)
        schedules = build_param_schedulers(cfg.OPTIMIZER, batch_size_per_replica=8, world_size=1)
        optimizer = build_optimizer(cfg.OPTIMIZER, TinyModel(), param_schedulers=schedules)
    assert [str(w.message) for w in caught] == []
    assert cfg.OPTIMIZER.param_schedulers.weight_decay.name == "cosine"
    assert schedules.has_weight_decay
    schedules.apply(optimizer, 0.5, "step")
    assert _wd(optimizer)["trunk_regularized"] == pytest.approx(0.22)


# ------------------------------------------------------------------ weight_decay_head
# VISSL 0.1.6's get_optimizer_param_groups: the head's regularized group takes the
# weight_decay_head schedule when it is set (in place of head_optimizer_params.weight_decay,
# whatever use_different_wd says); the trunk keeps weight_decay (schedule or constant).


def _linear(start: float, end: float, where: float) -> float:
    return start + (end - start) * where


def test_head_group_follows_weight_decay_head_and_the_trunk_weight_decay() -> None:
    schedules, optimizer = _build(_opt_cfg(WD_COSINE, WD_HEAD_LINEAR))
    assert schedules.names == ["lr", "lr_head", "weight_decay", "weight_decay_head"]
    assert schedules.update_interval("weight_decay_head") == "step"
    assert _wd(optimizer)["head_regularized"] == pytest.approx(0.1)  # built at where = 0
    assert _wd(optimizer)["trunk_regularized"] == pytest.approx(0.04)
    for where in WHERES:
        schedules.apply(optimizer, where, "step")
        w = min(where, 1 - 1e-6)
        wd = _wd(optimizer)
        assert wd["head_regularized"] == pytest.approx(_linear(0.1, 0.0, w), abs=1e-6), where
        assert wd["trunk_regularized"] == pytest.approx(_cosine(0.04, 0.4, w), abs=1e-6)
        assert wd["trunk_unregularized"] == 0.0 and wd["head_unregularized"] == 0.0


def test_weight_decay_head_alone_leaves_the_trunk_at_its_constant() -> None:
    schedules, optimizer = _build(_opt_cfg(head_schedule=WD_HEAD_LINEAR))
    assert not schedules.has_weight_decay and schedules.has_weight_decay_head
    for where in WHERES:
        schedules.apply(optimizer, where, None)
        wd = _wd(optimizer)
        assert wd["trunk_regularized"] == 1e-4  # OPTIMIZER.weight_decay
        expected = _linear(0.1, 0.0, min(where, 1 - 1e-6))
        assert wd["head_regularized"] == pytest.approx(expected, abs=1e-6)


def test_weight_decay_head_replaces_the_heads_fixed_weight_decay(caplog) -> None:
    """use_different_wd with weight_decay_head: the schedule wins (VISSL), said once."""
    cfg = _opt_cfg(
        WD_COSINE,
        WD_HEAD_LINEAR,
        head_optimizer_params={"use_different_wd": True, "weight_decay": 0.5},
    )
    with caplog.at_level("WARNING", logger="vissl.optimizers.build"):
        schedules, optimizer = _build(cfg)
    assert any(
        "head_optimizer_params.weight_decay is not used" in r.message for r in caplog.records
    )
    schedules.apply(optimizer, 0.5, "step")
    assert _wd(optimizer)["head_regularized"] == pytest.approx(0.05)


def test_weight_decay_head_per_epoch_is_updated_per_epoch_only() -> None:
    schedules, optimizer = _build(
        _opt_cfg(WD_COSINE, {**WD_HEAD_LINEAR, "update_interval": "epoch"})
    )
    schedules.apply(optimizer, 0.5, "step")
    assert _wd(optimizer)["head_regularized"] == pytest.approx(0.1)  # not due
    assert _wd(optimizer)["trunk_regularized"] == pytest.approx(0.22)  # per step
    schedules.apply(optimizer, 0.5, "epoch")
    assert _wd(optimizer)["head_regularized"] == pytest.approx(0.05)


@pytest.mark.parametrize(
    "overrides",
    [{"construct_single_param_group_only": True}, {"param_group_constructor": "dino"}],
)
def test_weight_decay_head_without_a_head_group_has_no_effect_and_says_so(
    caplog, overrides: dict
) -> None:
    """The single group and the dino constructor's groups follow weight_decay, as in
    VISSL (which ignores weight_decay_head there)."""
    with caplog.at_level("WARNING", logger="vissl.optimizers.build"):
        schedules, optimizer = _build(_opt_cfg(WD_COSINE, WD_HEAD_LINEAR, **overrides))
    assert any("no param group follows it" in r.message for r in caplog.records)
    schedules.apply(optimizer, 0.5, "step")
    wd = _wd(optimizer)
    followed = {n: v for n, v in wd.items() if v}
    assert followed and all(v == pytest.approx(0.22) for v in followed.values()), wd


def test_composed_config_with_weight_decay_head_is_accepted_without_warnings() -> None:
    overrides = [
        "config=quick_start",
        *(f"+config.OPTIMIZER.param_schedulers.weight_decay.{k}={v}" for k, v in WD_COSINE.items()),
        *(
            f"+config.OPTIMIZER.param_schedulers.weight_decay_head.{k}={v}"
            for k, v in WD_HEAD_LINEAR.items()
        ),
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, cfg = hydra_compose_and_validate(overrides)
        schedules = build_param_schedulers(cfg.OPTIMIZER, batch_size_per_replica=8, world_size=1)
        optimizer = build_optimizer(cfg.OPTIMIZER, TinyModel(), param_schedulers=schedules)
    assert [str(w.message) for w in caught] == []
    schedules.apply(optimizer, 0.5, "step")
    assert _wd(optimizer)["head_regularized"] == pytest.approx(0.05)
    assert _wd(optimizer)["trunk_regularized"] == pytest.approx(0.22)


# VISSL 0.1.6's quick_dino.yaml unchanged but for a CPU run without ImageNet (device,
# backend, synthetic images, fewer and smaller batches, one epoch) and a head schedule that
# ends apart from the trunk's (the file gives both the same cosine 0.04 -> 0.4).
VISSL_QUICK_DINO_CPU = [
    "config.MACHINE.DEVICE=cpu",
    "config.DISTRIBUTED.BACKEND=gloo",
    "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
    "config.DATA.TRAIN.DATA_LIMIT=8",  # 2 processes x 2 images: 2 steps
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2",
    "config.DATA.NUM_DATALOADER_WORKERS=0",
    "config.OPTIMIZER.num_epochs=1",
    "config.OPTIMIZER.param_schedulers.weight_decay_head.end_value=0.2",
]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(1200)
@needs_vissl_configs
def test_vissl_0_1_6_quick_dino_schedules_the_heads_weight_decay(tmp_path, monkeypatch) -> None:
    """VISSL 0.1.6's quick_dino (a ViT-S/16 at 224 px with weight_decay and
    weight_decay_head schedules) composes without a refusal and trains 2 steps on 2
    processes; the final checkpoint's head group holds weight_decay_head's value at the
    last step's ``where`` and the trunk group weight_decay's. About 1 minute per step on 2
    busy cores."""
    from tests._vissl_configs import copy_vissl_config
    from tests.integration._runs import run_config
    from vissl.utils.checkpoint import load_checkpoint

    name = copy_vissl_config(tmp_path, "test/integration_test/quick_dino.yaml", monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # COPY_DESTINATION_DIR (not implemented), bf16 on CPU
        run_config(name, *VISSL_QUICK_DINO_CPU)
    state = load_checkpoint(str(tmp_path / "model_final_checkpoint_phase0.torch"))
    groups = {
        g["param_group_name"]: g["weight_decay"]
        for g in state["classy_state_dict"]["optimizer"]["param_groups"]
    }
    where = 1 / 2  # the second of 2 steps
    assert groups["head_regularized"] == pytest.approx(_cosine(0.04, 0.2, where))
    assert groups["trunk_regularized"] == pytest.approx(_cosine(0.04, 0.4, where))
    assert groups["trunk_unregularized"] == groups["head_unregularized"] == 0.0

"""LARS (``OPTIMIZER.name: lars``) against a hand computation of the Barlow Twins rule."""

from __future__ import annotations

import copy
import io
import warnings
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.config.validation import UnsupportedConfigWarning
from vissl.errors import ConfigError
from vissl.optimizers import build_optimizer, build_param_schedulers
from vissl.optimizers.lars import LARS
from vissl.utils.hydra_config import hydra_compose_and_validate


class Net(nn.Module):
    """Linear + BatchNorm1d + Linear (with biases), a zero bias and an unused parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 6)
        self.bn = nn.BatchNorm1d(6)
        self.heads = nn.ModuleList([nn.Linear(6, 3)])
        self.unused = nn.Parameter(torch.ones(2, 2))  # never gets a gradient
        with torch.no_grad():
            self.fc1.bias.zero_()  # ||p|| = 0: trust ratio 1 on the first step
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.heads[0](torch.relu(self.bn(self.fc1(x))))


def _batches(steps: int) -> Iterator[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        yield torch.randn(8, 5, generator=gen)


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return (model(x) ** 2).mean()


def _groups(model: Net, weight_decay: float) -> list[dict]:
    """Two groups with their own lr and weight decay (weights / 1-D parameters)."""
    weights = [model.fc1.weight, model.heads[0].weight, model.unused]
    others = [model.fc1.bias, model.bn.weight, model.bn.bias, model.heads[0].bias]
    return [
        {"params": weights, "lr": 0.1, "weight_decay": weight_decay},
        {"params": others, "lr": 0.3, "weight_decay": weight_decay / 2},
    ]


def _reference_step(
    groups: list[dict],
    buffers: dict[int, torch.Tensor],
    *,
    momentum: float,
    eta: float,
    nesterov: bool,
    exclude: bool,
) -> None:
    """The LARS update written out, one parameter at a time, on the parameter data."""
    for group in groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            d = p.grad.detach().clone()
            w = p.detach()
            if not (exclude and w.dim() == 1):
                d = d + group["weight_decay"] * w
                w_norm = float(torch.sqrt((w.double() ** 2).sum()))
                d_norm = float(torch.sqrt((d.double() ** 2).sum()))
                trust = eta * w_norm / d_norm if w_norm > 0 and d_norm > 0 else 1.0
                d = d * trust
            if id(p) not in buffers:
                buffers[id(p)] = d.clone()
            else:
                buffers[id(p)] = momentum * buffers[id(p)] + d
            update = d + momentum * buffers[id(p)] if nesterov else buffers[id(p)]
            p.data = w - group["lr"] * update


CASES = [
    (exclude, weight_decay, nesterov)
    for exclude in (False, True)
    for weight_decay in (0.0, 0.05)
    for nesterov in (False, True)
]


@pytest.mark.parametrize(("exclude", "weight_decay", "nesterov"), CASES)
@pytest.mark.parametrize("steps", [1, 4])
def test_steps_match_the_formula(
    exclude: bool, weight_decay: float, nesterov: bool, steps: int
) -> None:
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    eta, momentum = 0.02, 0.9
    optimizer = LARS(
        _groups(model, weight_decay),
        momentum=momentum,
        eta=eta,
        nesterov=nesterov,
        exclude_bias_and_norm=exclude,
    )
    ref_groups = _groups(reference, weight_decay)
    buffers: dict[int, torch.Tensor] = {}
    for x in _batches(steps):
        for m in (model, reference):
            m.zero_grad(set_to_none=True)
            _loss(m, x).backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        saved = [g.clone() for g in grads]
        optimizer.step()
        _reference_step(
            ref_groups, buffers, momentum=momentum, eta=eta, nesterov=nesterov, exclude=exclude
        )
        # the gradients are left as they were
        assert all(torch.equal(g, s) for g, s in zip(grads, saved, strict=True))
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6, msg=name)
    assert torch.equal(model.unused, torch.ones(2, 2))


def test_exclusion_gives_1d_parameters_plain_momentum_sgd() -> None:
    torch.manual_seed(0)
    model = Net()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = LARS(_groups(model, 0.05), momentum=0.9, eta=0.001, exclude_bias_and_norm=True)
    _loss(model, next(_batches(1))).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    for name in ("fc1.bias", "bn.weight", "bn.bias", "heads.0.bias"):
        # first step: mu = g, no weight decay, no trust ratio; lr 0.3 (second group)
        torch.testing.assert_close(
            model.get_parameter(name), before[name] - 0.3 * grads[name], atol=1e-6, rtol=1e-6
        )
    # the weights are adapted: the step has length lr * eta * ||w|| (first step, mu = d)
    w_before = before["fc1.weight"]
    step = torch.linalg.vector_norm(model.fc1.weight - w_before)
    torch.testing.assert_close(step, 0.1 * 0.001 * torch.linalg.vector_norm(w_before))


def test_zero_norm_parameter_keeps_the_plain_gradient() -> None:
    p = nn.Parameter(torch.zeros(3, 2))
    p.grad = torch.full((3, 2), 0.5)
    LARS([p], lr=0.1, momentum=0.0, weight_decay=0.1, eta=0.001).step()
    # ||p|| = 0: trust 1; weight decay adds 0
    torch.testing.assert_close(p.detach(), torch.full((3, 2), -0.05))


def test_no_momentum_keeps_no_state() -> None:
    p = nn.Parameter(torch.tensor([[3.0, 4.0]]))  # ||p|| = 5
    p.grad = torch.tensor([[0.6, 0.8]])  # ||g|| = 1
    optimizer = LARS([p], lr=0.5, momentum=0.0, eta=0.01)
    optimizer.step()
    # trust = 0.01 * 5 / 1
    torch.testing.assert_close(p.detach(), torch.tensor([[3.0 - 0.5 * 0.05 * 0.6, 4.0 - 0.02]]))
    assert len(optimizer.state) == 0


def _train(model: Net, optimizer: torch.optim.Optimizer, batches: list[torch.Tensor]) -> None:
    for x in batches:
        optimizer.zero_grad(set_to_none=True)
        _loss(model, x).backward()
        optimizer.step()


@pytest.mark.parametrize("nesterov", [False, True])
def test_state_dict_round_trip_resumes_bitwise(nesterov: bool) -> None:
    torch.manual_seed(0)
    batches = list(_batches(6))

    def make(model: Net) -> LARS:
        return LARS(
            _groups(model, 0.05),
            momentum=0.9,
            eta=0.02,
            nesterov=nesterov,
            exclude_bias_and_norm=True,
        )

    straight = Net()
    resumed = copy.deepcopy(straight)
    opt = make(straight)
    _train(straight, opt, batches)

    first = make(resumed)
    _train(resumed, first, batches[:3])
    buffer = io.BytesIO()
    torch.save({"model": resumed.state_dict(), "optimizer": first.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)

    restarted = Net()
    restarted.load_state_dict(checkpoint["model"])
    second = LARS(
        _groups(restarted, 0.0), momentum=0.0, eta=1.0
    )  # the state dict restores every group setting
    second.load_state_dict(checkpoint["optimizer"])
    saved_group = second.state_dict()["param_groups"][0]
    assert saved_group["eta"] == 0.02 and saved_group["exclude_bias_and_norm"] is True
    assert saved_group["nesterov"] is nesterov and saved_group["momentum"] == 0.9
    _train(restarted, second, batches[3:])

    for (name, p), q in zip(straight.named_parameters(), restarted.parameters()):
        assert torch.equal(p, q), name
    for p, q in zip(straight.parameters(), restarted.parameters()):
        if "momentum_buffer" in opt.state[p]:
            assert torch.equal(opt.state[p]["momentum_buffer"], second.state[q]["momentum_buffer"])


# ------------------------------------------------------------------ from the config


@pytest.fixture(scope="module")
def composed() -> AttrDict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, cfg = hydra_compose_and_validate(
            [
                "config=quick_start",
                "config.OPTIMIZER.name=lars",
                "config.OPTIMIZER.eta=0.02",
                "config.OPTIMIZER.exclude_bias_and_norm=true",
                "config.OPTIMIZER.nesterov=true",
                "config.OPTIMIZER.weight_decay=0.05",
            ]
        )
    assert not [w for w in caught if issubclass(w.category, UnsupportedConfigWarning)]
    return cfg


def test_built_from_a_composed_config(composed: AttrDict) -> None:
    torch.manual_seed(0)
    model = Net()
    reference = copy.deepcopy(model)
    schedules = build_param_schedulers(composed.OPTIMIZER, batch_size_per_replica=8, world_size=1)
    optimizer = build_optimizer(composed.OPTIMIZER, model, param_schedulers=schedules)
    assert type(optimizer) is LARS
    for group in optimizer.param_groups:
        assert group["eta"] == 0.02 and group["exclude_bias_and_norm"] is True
        assert group["nesterov"] is True and group["momentum"] == composed.OPTIMIZER.momentum
    by_name = {g["param_group_name"]: g for g in optimizer.param_groups}
    assert by_name["trunk_regularized"]["weight_decay"] == 0.05
    assert by_name["trunk_unregularized"]["weight_decay"] == 0.0  # bn (regularize_bn false)

    # the built groups, step by step, against the hand computation
    id_to_ref = dict(zip((id(p) for p in model.parameters()), reference.parameters()))
    ref_groups = [
        {**g, "params": [id_to_ref[id(p)] for p in g["params"]]} for g in optimizer.param_groups
    ]
    buffers: dict[int, torch.Tensor] = {}
    for x in _batches(3):
        for m in (model, reference):
            m.zero_grad(set_to_none=True)
            _loss(m, x).backward()
        optimizer.step()
        _reference_step(
            ref_groups,
            buffers,
            momentum=composed.OPTIMIZER.momentum,
            eta=0.02,
            nesterov=True,
            exclude=True,
        )
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6, msg=name)


def _opt_cfg(**overrides: object) -> AttrDict:
    cfg = {
        "name": "lars",
        "use_larc": False,
        "weight_decay": 1e-4,
        "momentum": 0.9,
        "nesterov": False,
        "eta": 0.001,
        "exclude_bias_and_norm": False,
        "num_epochs": 10,
        "param_schedulers": {"lr": {"name": "constant", "value": 0.1}},
    }
    cfg.update(overrides)
    return AttrDict(cfg)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"eta": 0.0}, "config.OPTIMIZER.eta"),
        ({"eta": -0.001}, "config.OPTIMIZER.eta"),
        ({"eta": "big"}, "config.OPTIMIZER.eta"),
        ({"momentum": 1.0}, "config.OPTIMIZER.momentum"),
        ({"momentum": -0.5}, "config.OPTIMIZER.momentum"),
        ({"nesterov": True, "momentum": 0.0}, "config.OPTIMIZER.nesterov"),
        ({"nesterov": "yes"}, "config.OPTIMIZER.nesterov"),
        ({"exclude_bias_and_norm": 1}, "config.OPTIMIZER.exclude_bias_and_norm"),
        ({"weight_decay": -0.1}, "config.OPTIMIZER.weight_decay"),
        ({"use_larc": True}, "config.OPTIMIZER.use_larc"),
    ],
)
def test_bad_values_name_the_key(overrides: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_optimizer(_opt_cfg(**overrides), Net())
    assert info.value.key_path == key
    assert key in str(info.value)


def test_larc_with_lars_says_why() -> None:
    with pytest.raises(ConfigError, match="second time"):
        build_optimizer(_opt_cfg(use_larc=True), Net())


@pytest.mark.parametrize(
    "kwargs",
    [{"eta": 0.0}, {"momentum": 1.0}, {"lr": -1.0}, {"weight_decay": -1.0}, {"nesterov": True}],
)
def test_constructor_rejects_bad_values(kwargs: dict) -> None:
    settings = {"momentum": 0.0, **kwargs} if "nesterov" in kwargs else kwargs
    with pytest.raises(ValueError):
        LARS([nn.Parameter(torch.ones(2))], **settings)

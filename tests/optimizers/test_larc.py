"""Native LARC against a hand computation of apex's rule."""

from __future__ import annotations

import pytest
import torch

from vissl.optimizers import LARC


def _setup(
    lr: float, weight_decay: float
) -> tuple[torch.nn.Parameter, torch.nn.Parameter, torch.optim.SGD]:
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))  # ||w|| = 5
    b = torch.nn.Parameter(torch.tensor([1.0]))
    sgd = torch.optim.SGD(
        [{"params": [w], "weight_decay": weight_decay}, {"params": [b], "weight_decay": 0.0}],
        lr=lr,
        momentum=0.0,
    )
    w.grad = torch.tensor([0.6, 0.8])  # ||g|| = 1
    b.grad = torch.tensor([0.0])  # zero gradient: left alone
    return w, b, sgd


@pytest.mark.parametrize("clip", [False, True])
def test_larc_step_matches_hand_computation(clip: bool) -> None:
    lr, wd, trust, eps = 0.1, 0.01, 0.02, 1e-8
    w, b, sgd = _setup(lr, wd)
    larc = LARC(sgd, trust_coefficient=trust, clip=clip, eps=eps)
    larc.step()

    local_lr = trust * 5.0 / (1.0 + 5.0 * wd + eps)
    if clip:
        local_lr = min(local_lr / lr, 1.0)
    expected_grad = [(g + wd * x) * local_lr for g, x in zip([0.6, 0.8], [3.0, 4.0])]
    expected_w = [x - lr * g for x, g in zip([3.0, 4.0], expected_grad)]
    assert w.detach().tolist() == pytest.approx(expected_w, rel=1e-6)
    assert b.detach().tolist() == [1.0]
    # weight decay is restored on the wrapped optimizer after the step
    assert sgd.param_groups[0]["weight_decay"] == wd


def test_clip_caps_at_the_group_lr() -> None:
    # A large trust ratio: clipping makes the effective rate exactly lr.
    w, _, sgd = _setup(lr=0.1, weight_decay=0.0)
    LARC(sgd, trust_coefficient=100.0, clip=True).step()
    assert w.detach().tolist() == pytest.approx([3.0 - 0.1 * 0.6, 4.0 - 0.1 * 0.8])


def test_state_dict_round_trip_and_zero_grad() -> None:
    w = torch.nn.Parameter(torch.ones(3))
    larc = LARC(torch.optim.SGD([w], lr=0.5, momentum=0.9), trust_coefficient=0.02, clip=False)
    w.grad = torch.full((3,), 0.5)
    larc.step()
    state = larc.state_dict()
    assert "momentum_buffer" in state["state"][0]
    other_w = torch.nn.Parameter(torch.ones(3))
    other = LARC(torch.optim.SGD([other_w], lr=0.1, momentum=0.9))
    other.load_state_dict(state)
    assert other.param_groups[0]["lr"] == 0.5
    assert torch.equal(other.state[other_w]["momentum_buffer"], larc.state[w]["momentum_buffer"])
    larc.zero_grad()
    assert w.grad is None
    larc.param_groups[0]["lr"] = 0.25
    assert larc.optim.param_groups[0]["lr"] == 0.25

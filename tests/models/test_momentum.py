"""Momentum copies: frozen deep copies whose parameters follow the model by EMA."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vissl.models.momentum import ema_update_, momentum_copy


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_copy_is_equal_frozen_and_separate() -> None:
    model = _model()
    copy = momentum_copy(model)
    for (name, p), (_, q) in zip(model.named_parameters(), copy.named_parameters(), strict=True):
        assert torch.equal(p, q) and not q.requires_grad, name
        assert p.data_ptr() != q.data_ptr()


def test_ema_follows_the_formula_and_leaves_buffers() -> None:
    model = _model()
    target = momentum_copy(model)
    before = {k: v.clone() for k, v in target.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
        model[1].running_mean.fill_(5.0)
    ema_update_(target, model, 0.9)
    for name, source in model.named_parameters():
        expected = 0.9 * before[name] + 0.1 * source
        torch.testing.assert_close(dict(target.named_parameters())[name], expected)
    assert torch.equal(target[1].running_mean, torch.zeros(4))  # buffers are not averaged


def test_ema_sees_through_wrappers_and_rejects_other_models() -> None:
    model = _model()
    target = momentum_copy(model)

    class Wrapper(nn.Module):
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

    ema_update_(target, Wrapper(model), 0.5)  # DDP-like .module is unwrapped
    with pytest.raises(ValueError, match="differ in their parameters"):
        ema_update_(target, nn.Linear(3, 4), 0.5)


def test_momentum_one_keeps_and_zero_copies() -> None:
    model = _model()
    target = momentum_copy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0).add_(1.0)
    kept = {k: v.clone() for k, v in target.named_parameters()}
    ema_update_(target, model, 1.0)
    assert all(torch.equal(v, kept[k]) for k, v in target.named_parameters())
    ema_update_(target, model, 0.0)
    assert all(
        torch.equal(v, dict(model.named_parameters())[k]) for k, v in target.named_parameters()
    )


def _copy_with_process_group(rank: int, world_size: int) -> tuple[bool, bool, int]:
    import torch.distributed as dist

    from vissl.models.momentum import momentum_copies

    group = dist.new_group([rank])  # a sub-group, as SYNC_BN_CONFIG.GROUP_SIZE=1 makes
    model = nn.Sequential(nn.Linear(3, 4), nn.SyncBatchNorm(4, process_group=group))
    copy = momentum_copy(model)  # raised "cannot pickle ProcessGroup" before
    holder = type("Holder", (), {})()
    holder.model = copy
    return copy[1].process_group is group, copy[1] is not model[1], len(momentum_copies(holder))


def test_copy_of_a_model_with_sync_bn_sub_groups_shares_the_group() -> None:
    from vissl.utils.test_utils import spawn_gloo

    for shared, separate, found in spawn_gloo(_copy_with_process_group, 2):
        assert shared and separate and found == 1


def test_momentum_copies_are_found_and_reset_to_the_model() -> None:
    from vissl.models.momentum import momentum_copies, reset_momentum_copy_

    model = _model()
    owner = nn.Module()
    owner.encoder = momentum_copy(model)
    owner.other = nn.Linear(2, 2)
    assert momentum_copies(owner) == [owner.encoder]
    assert momentum_copies(nn.Linear(2, 2)) == []
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.add_(1)
    reset_momentum_copy_(owner.encoder, model)
    for (name, a), b in zip(model.state_dict().items(), owner.encoder.state_dict().values()):
        assert torch.equal(a, b), name
    assert not any(p.requires_grad for p in owner.encoder.parameters())


def test_ema_update_pairs_parameters_once_and_stays_right_after_a_move(monkeypatch) -> None:
    """A per-step update does no name lookups (DINO's, MoCo's and SwAV's hooks call it
    every step); the pairs stay valid when a module is moved or converted."""
    model = _model()
    target = momentum_copy(model)
    calls = []
    real = nn.Module.named_parameters

    def counted(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "named_parameters", counted)
    for _ in range(3):
        ema_update_(target, model, 0.5)
    assert len(calls) == 2  # the first call pairs target and source, once
    target.to(torch.float64)  # same Parameter objects, new data
    before = {k: v.clone() for k, v in target.named_parameters()}
    ema_update_(target, model, 0.25)
    for (name, p), q in zip(target.named_parameters(), model.parameters(), strict=True):
        expected = 0.25 * before[name] + 0.75 * q.detach().double()
        torch.testing.assert_close(p, expected, msg=name)
    other = _model()
    ema_update_(target, other, 0.0)  # another source: paired anew
    for p, q in zip(target.parameters(), other.parameters(), strict=True):
        torch.testing.assert_close(p, q.detach().double())


class _Chain(nn.Module):
    """trunk + a [projector, predictor] head chain, like the base model."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(3, 4)
        self.heads = nn.ModuleList(
            [nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5)), nn.Linear(5, 5)]
        )


def test_copy_without_the_predictor_pairs_the_rest() -> None:
    """BYOL's and MoCo v3's target network: the model less its last head."""
    from vissl.models.momentum import ema_tensors, reset_momentum_copy_

    model = _Chain()
    target = momentum_copy(model, drop_last_heads=1)
    assert len(target.heads) == 1 and len(model.heads) == 2  # the model keeps its own
    names = {n for n, _ in model.named_parameters() if not n.startswith("heads.1.")}
    assert {n for n, _ in target.named_parameters()} == names
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    before = {n: p.clone() for n, p in target.named_parameters()}
    ema_update_(target, model, 0.75)
    source = dict(model.named_parameters())
    for n, p in target.named_parameters():
        torch.testing.assert_close(p, 0.75 * before[n] + 0.25 * source[n].detach())
    tensors = ema_tensors(target, model)
    assert len(tensors.target_params) == len(names)
    assert len(tensors.target_buffers) == 3  # the projector's BatchNorm
    reset_momentum_copy_(target, model)
    for n, p in target.named_parameters():
        assert torch.equal(p, source[n])
    # a copy of another model with other parameters is still refused
    other = _Chain()
    other.heads[0] = nn.Linear(4, 5)
    with pytest.raises(ValueError, match="differ"):
        ema_update_(momentum_copy(other, drop_last_heads=1), model, 0.5)


@pytest.mark.parametrize("drop", [-1, 2, 3])
def test_dropping_every_head_or_a_negative_number_is_refused(drop: int) -> None:
    with pytest.raises(ValueError, match="cannot drop"):
        momentum_copy(_Chain(), drop_last_heads=drop)


def _python_calls_in(fn, filename: str) -> int:
    """Python calls (generator resumes included) made in ``filename`` while ``fn`` runs."""
    import sys

    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.endswith(filename):
            calls += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_ema_update_makes_no_python_loop_over_the_parameters() -> None:
    """The per-step update of 100 parameter pairs: a few Python calls, not one per pair
    (the dtype / device check is made once per pairing)."""
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(50)))
    target = momentum_copy(model)
    ema_update_(target, model, 0.5)  # pairs them
    calls = _python_calls_in(lambda: ema_update_(target, model, 0.5), "momentum.py")
    assert calls <= 5, calls


def test_ema_update_refuses_a_copy_cast_in_part_after_pairing() -> None:
    """A submodule cast in place after pairing (not the first pair, not seen by the cheap
    check) fails loudly, naming forget_pairing; after it, the update converts."""
    from vissl.models.momentum import forget_pairing

    model = _model()
    target = momentum_copy(model)
    ema_update_(target, model, 0.5)
    target[2].to(torch.float64)
    with pytest.raises(RuntimeError, match="forget_pairing"):
        ema_update_(target, model, 0.5)
    forget_pairing(target)
    before = target[2].weight.detach().clone()
    ema_update_(target, model, 0.25)
    expected = 0.25 * before + 0.75 * model[2].weight.detach().double()
    torch.testing.assert_close(target[2].weight, expected)

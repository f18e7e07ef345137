"""``vissl.models.center.Center``: the EMA of a teacher's outputs that DINO, iBOT and DINOv2
subtract, against computations written here (float64, no vissl code): the update in both
arithmetic forms, the centred softmax, no change (and no NaN) on zero rows, the buffer
read by name through ``.to`` and ``load_state_dict``, and on 2 gloo ranks the center of
the concatenated batch, with unequal and empty rows per rank."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vissl.losses.dino_loss import DINOLoss
from vissl.models.center import Center, ema_center_, global_row_sum_and_count
from vissl.utils.test_utils import spawn_gloo

D = 5
FORMS = ["scale_add", "weighted_sum"]


class Owner(nn.Module):
    """A module holding the center buffer, as a loss does."""

    def __init__(self, shape: tuple[int, ...] = (1, D), start: float = 0.0) -> None:
        super().__init__()
        self.register_buffer("center", torch.full(shape, start))


def reference_ema(center: torch.Tensor, batches: list[torch.Tensor], m: float) -> torch.Tensor:
    """``c = m c + (1 - m) mean(rows)`` in float64 per batch; a batch of no rows skipped."""
    c = center.double().clone()
    for rows in batches:
        if rows.shape[0] == 0:
            continue
        mean = rows.double().sum(dim=0) / rows.shape[0]
        c = m * c + (1 - m) * mean.reshape(c.shape)
    return c


def reference_softmax(logits: torch.Tensor, center: torch.Tensor, tau: float) -> torch.Tensor:
    z = (logits.double() - center.double()) / tau
    e = torch.exp(z - z.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


# ----------------------------------------------------------------------------- one process
@pytest.mark.parametrize("form", FORMS)
def test_update_is_the_ema_of_the_batch_means(form: str) -> None:
    torch.manual_seed(0)
    owner = Owner(start=0.3)
    center = Center(owner, "center", 0.8, form)  # type: ignore[arg-type]
    start = owner.center.clone()
    batches = [torch.randn(n, D) * 3 + 1 for n in (4, 1, 7)]
    for rows in batches:
        center.update(rows)
    expected = reference_ema(start, batches, 0.8)
    torch.testing.assert_close(owner.center.double(), expected, rtol=0, atol=1e-6)
    # the control: a center that followed only the last batch is not this one
    assert not torch.allclose(owner.center.double(), reference_ema(start, batches[-1:], 0.8))
    assert center.value is owner.center


@pytest.mark.parametrize("form", FORMS)
def test_each_form_is_its_documented_arithmetic_bitwise(form: str) -> None:
    torch.manual_seed(1)
    owner = Owner()
    owner.center.copy_(torch.randn(1, D))
    c0 = owner.center.clone()
    rows = torch.randn(6, D)
    m = 0.9
    Center(owner, "center", m, form).update(rows)  # type: ignore[arg-type]
    mean = (rows.sum(dim=0) / 6.0).reshape(1, D)
    if form == "scale_add":
        expected = c0.mul(m).add_(mean, alpha=1.0 - m)
    else:
        expected = c0 * m + mean * (1.0 - m)
    assert torch.equal(owner.center, expected)


def test_momentum_one_keeps_and_zero_replaces() -> None:
    rows = torch.arange(12.0).reshape(3, 4)
    keep, replace = Owner((1, 4), 2.0), Owner((1, 4), 2.0)
    Center(keep, "center", 1.0).update(rows)
    Center(replace, "center", 0.0).update(rows)
    assert torch.equal(keep.center, torch.full((1, 4), 2.0))
    assert torch.equal(replace.center, rows.mean(dim=0, keepdim=True))


def test_a_patch_center_of_another_shape() -> None:
    """iBOT's patch center is ``(1, 1, D)``: the rows are reshaped to it."""
    torch.manual_seed(2)
    owner = Owner((1, 1, D))
    rows = torch.randn(3, D)
    Center(owner, "center", 0.5).update(rows)
    assert owner.center.shape == (1, 1, D)
    torch.testing.assert_close(
        owner.center.double(), 0.5 * rows.double().mean(dim=0).reshape(1, 1, D), rtol=0, atol=1e-7
    )


@pytest.mark.parametrize("form", FORMS)
def test_zero_rows_leave_the_center_and_make_no_nan(form: str) -> None:
    owner = Owner(start=0.25)
    center = Center(owner, "center", 0.9, form)  # type: ignore[arg-type]
    center.update(torch.empty(0, D))
    assert torch.equal(owner.center, torch.full((1, D), 0.25))
    assert not owner.center.isnan().any()
    total, count = global_row_sum_and_count(torch.empty(0, D))
    assert torch.equal(total, torch.zeros(D)) and float(count) == 0.0


def test_the_update_reads_float32_of_half_rows_and_no_gradient() -> None:
    owner = Owner()
    rows = torch.randn(4, D, requires_grad=True)
    Center(owner, "center", 0.5).update(rows.to(torch.bfloat16))
    assert owner.center.dtype == torch.float32 and not owner.center.requires_grad
    torch.testing.assert_close(
        owner.center, 0.5 * rows.detach().to(torch.bfloat16).float().mean(0, keepdim=True)
    )


def test_apply_is_the_centred_softmax() -> None:
    torch.manual_seed(3)
    owner = Owner()
    owner.center.copy_(torch.randn(1, D))
    center = Center(owner, "center", 0.9)
    logits = torch.randn(6, D) * 4
    for tau in (0.04, 0.1, 1.0):
        got = center.apply(logits, tau)
        torch.testing.assert_close(
            got.double(), reference_softmax(logits, owner.center, tau), rtol=0, atol=1e-6
        )
        torch.testing.assert_close(got.sum(dim=-1), torch.ones(6))
    # the center matters: without it the softmax differs
    assert not torch.allclose(center.apply(logits, 0.1), torch.softmax(logits / 0.1, dim=-1))
    # apply does not move the center
    before = owner.center.clone()
    center.apply(logits, 0.1)
    assert torch.equal(owner.center, before)


def test_a_missing_buffer_is_named() -> None:
    with pytest.raises(ValueError, match="no buffer 'centre'"):
        Center(Owner(), "centre", 0.9)


def test_the_buffer_is_read_by_name_through_to_and_load_state_dict() -> None:
    torch.manual_seed(4)
    owner = Owner()
    center = Center(owner, "center", 0.7, "scale_add")
    center.update(torch.randn(5, D))
    state = {k: v.clone() for k, v in owner.state_dict().items()}
    assert list(state) == ["center"]  # the checkpoint key is the buffer's

    restored = Owner()
    restored_center = Center(restored, "center", 0.7, "scale_add")
    restored.load_state_dict(state)
    assert torch.equal(restored_center.value, owner.center)
    rows = torch.randn(3, D)
    center.update(rows)
    restored_center.update(rows)
    assert torch.equal(restored.center, owner.center)  # resumes bitwise

    owner.to(torch.float64)  # a new buffer object: still the one Center reads
    assert center.value is owner.center and center.value.dtype == torch.float64
    center.update(rows.double())
    assert owner.center.dtype == torch.float64


def test_a_loss_moves_its_center_in_training_only() -> None:
    """The owners' contract (DINO here): test phases (``eval()``) do not move the center."""
    torch.manual_seed(5)
    loss = DINOLoss(output_dim=D, num_crops=2, crops_for_teacher=[0])
    student, teacher = torch.randn(2 * 3, D), torch.randn(3, D)
    loss.eval()
    loss(student, teacher_output=teacher, teacher_temp=0.1)
    assert torch.equal(loss.center, torch.zeros(1, D))
    loss.train()
    loss(student, teacher_output=teacher, teacher_temp=0.1)
    expected = reference_ema(torch.zeros(1, D), [teacher], loss.ema_center)
    torch.testing.assert_close(loss.center.double(), expected, rtol=0, atol=1e-7)


# ----------------------------------------------------------------------------- 2 gloo ranks
def _rows(rank: int, step: int, sizes: list[list[int]]) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(sizes[step][rank], D, generator=g) * (rank + 1) + step


def _center_worker(rank: int, world: int, sizes: list[list[int]], form: str) -> torch.Tensor:
    owner = Owner(start=0.5)
    center = Center(owner, "center", 0.6, form)  # type: ignore[arg-type]
    for step in range(len(sizes)):
        center.update(_rows(rank, step, sizes))
    return owner.center.clone()


#: rows per rank at each step: unequal, one rank empty, both empty, equal
SIZES = [[3, 5], [0, 4], [0, 0], [2, 2], [6, 1]]


@pytest.mark.parametrize("form", FORMS)
def test_two_ranks_give_the_center_of_the_concatenated_batch(form: str) -> None:
    centers = spawn_gloo(_center_worker, 2, SIZES, form)
    assert torch.equal(centers[0], centers[1])  # every rank holds the same center
    # one process on the concatenated batch of each step
    single = Owner(start=0.5)
    one = Center(single, "center", 0.6, form)  # type: ignore[arg-type]
    batches = [torch.cat([_rows(r, s, SIZES) for r in range(2)]) for s in range(len(SIZES))]
    for rows in batches:
        one.update(rows)
    torch.testing.assert_close(centers[0], single.center, rtol=0, atol=1e-6)
    expected = reference_ema(torch.full((1, D), 0.5), batches, 0.6)
    torch.testing.assert_close(centers[0].double(), expected, rtol=0, atol=1e-5)
    assert not centers[0].isnan().any()
    # the control: averaging the ranks' means (equal weights) is another center
    naive = torch.full((1, D), 0.5, dtype=torch.float64)
    for s in range(len(SIZES)):
        means = [_rows(r, s, SIZES).double().mean(0) for r in range(2) if SIZES[s][r]]
        if means:
            naive = 0.6 * naive + 0.4 * torch.stack(means).mean(0)
    assert not torch.allclose(centers[0].double(), naive, atol=1e-3)


def _ema_worker(rank: int, world: int) -> torch.Tensor:
    center = torch.zeros(1, D)
    ema_center_(center, torch.full((rank * 2, D), float(rank + 1)), 0.5)
    return center


def test_ema_center_on_two_ranks_weighs_ranks_by_their_rows() -> None:
    # rank 0 has no rows, rank 1 two rows of 2.0: the global mean is 2.0
    centers = spawn_gloo(_ema_worker, 2)
    for c in centers:
        assert torch.equal(c, torch.full((1, D), 1.0))

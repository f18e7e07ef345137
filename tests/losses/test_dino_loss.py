"""dino_loss: the paper's formula written here, the center (EMA, eval mode, 2 ranks with
unequal batches), the temperature and momentum schedules, config errors, state_dict."""

from __future__ import annotations

import copy
import itertools
import math
from typing import Any

import pytest
import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses.build import build_loss
from vissl.losses.dino_loss import DINOLoss, cosine_momentum, teacher_temperature
from vissl.utils.test_utils import spawn_gloo

KEY = "config.LOSS.dino_loss"
TAU_S, TAU_T, EMA = 0.1, 0.05, 0.9


# ----------------------------------------------------------------------------- reference
def ref_dino(
    student: torch.Tensor,
    teacher: torch.Tensor,
    center: torch.Tensor,
    num_crops: int,
    crops_for_teacher: list[int],
    tau_s: float = TAU_S,
    tau_t: float = TAU_T,
) -> float:
    """DINO (Caron et al. 2021, Alg. 1), with loops, in float64.

    For each teacher crop c (teacher rows in ``crops_for_teacher`` order) and each student
    crop v != c: the mean over samples i of ``-sum_k P_t[i,k] log P_s[i,k]``, where
    ``P_t = softmax((t_c - center) / tau_t)`` and ``P_s = softmax(s_v / tau_s)``; the loss
    is the mean of these over the pairs.
    """
    s, t, ctr = student.double(), teacher.double(), center.double().reshape(-1)
    b = s.shape[0] // num_crops
    total, pairs = 0.0, 0
    for j, c in enumerate(crops_for_teacher):
        for v in range(num_crops):
            if v == c:
                continue
            pair = 0.0
            for i in range(b):
                tl = (t[j * b + i] - ctr) / tau_t
                p_t = torch.exp(tl - tl.max())
                p_t = p_t / p_t.sum()
                sl = s[v * b + i] / tau_s
                log_z = sl.max() + torch.log(torch.exp(sl - sl.max()).sum())
                pair += float(-(p_t * (sl - log_z)).sum())
            total += pair / b
            pairs += 1
    return total / pairs


def make_loss(num_crops: int = 4, crops: list[int] | None = None, dim: int = 6, **kw: Any):
    args: dict[str, Any] = dict(
        student_temp=TAU_S,
        teacher_temp_min=TAU_T,
        teacher_temp_max=TAU_T,
        teacher_temp_warmup_iters=0,
        ema_center=EMA,
        output_dim=dim,
        num_crops=num_crops,
        crops_for_teacher=[0, 1] if crops is None else crops,
    )
    args.update(kw)
    return DINOLoss(**args)


def _forward(loss: DINOLoss, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    return loss(student, teacher_output=teacher)


# ----------------------------------------------------------------------------- formula
@pytest.mark.parametrize(
    "num_crops,crops",
    [(4, [0, 1]), (2, [0, 1]), (4, [1, 0]), (3, [1])],
    ids=["2global+2local", "2global", "teacher-order-1-0", "one-teacher-crop"],
)
def test_loss_matches_the_papers_formula(num_crops: int, crops: list[int]) -> None:
    torch.manual_seed(0)
    b, dim = 5, 6
    loss = make_loss(num_crops, crops, dim)
    loss.center.copy_(torch.randn(1, dim) * 0.3)  # a non-zero center is subtracted
    loss.teacher_temp = TAU_T
    student = torch.randn(num_crops * b, dim)
    teacher = torch.randn(len(crops) * b, dim)
    expected = ref_dino(student, teacher, loss.center, num_crops, crops)
    assert _forward(loss, student, teacher).item() == pytest.approx(expected, rel=1e-5)


def test_the_teacher_temperature_set_on_the_loss_is_used() -> None:
    torch.manual_seed(1)
    loss = make_loss(4, [0, 1])
    student, teacher = torch.randn(12, 6), torch.randn(6, 6)
    loss.teacher_temp = 0.07
    got = _forward(loss, student, teacher).item()
    assert got == pytest.approx(ref_dino(student, teacher, torch.zeros(6), 4, [0, 1], tau_t=0.07))
    assert got != pytest.approx(ref_dino(student, teacher, torch.zeros(6), 4, [0, 1]), rel=1e-3)


def test_uniform_outputs_give_ln_output_dim() -> None:
    loss = make_loss(4, [0, 1], dim=64)
    got = _forward(loss, torch.zeros(8, 64), torch.zeros(4, 64)).item()
    assert got == pytest.approx(math.log(64), abs=1e-5)
    assert loss.uniform_loss == pytest.approx(math.log(64))


def test_gradient_reaches_the_student_only() -> None:
    torch.manual_seed(2)
    loss = make_loss(4, [0, 1])
    student = torch.randn(8, 6, requires_grad=True)
    teacher = torch.randn(4, 6, requires_grad=True)
    _forward(loss, student, teacher).backward()
    assert student.grad is not None and student.grad.abs().sum() > 0
    assert teacher.grad is None  # the target is detached
    # d/ds of -sum p log softmax(s/T): (softmax(s/T) - p)/T averaged; rows sum to 0.
    assert torch.allclose(student.grad.sum(dim=1), torch.zeros(8), atol=1e-6)


def test_a_call_without_the_teacher_output_says_how_to_pass_it() -> None:
    loss = make_loss(2, [0, 1])
    _forward(loss, torch.randn(4, 6), torch.randn(4, 6))
    with pytest.raises(TypeError, match="teacher_output="):
        loss(torch.randn(4, 6))


def test_the_teacher_temperature_passed_to_forward_is_used() -> None:
    torch.manual_seed(1)
    loss = make_loss(4, [0, 1])
    student, teacher = torch.randn(12, 6), torch.randn(6, 6)
    got = loss(student, teacher_output=teacher, teacher_temp=0.07).item()
    assert got == pytest.approx(ref_dino(student, teacher, torch.zeros(6), 4, [0, 1], tau_t=0.07))
    assert loss.teacher_temp == loss.teacher_temp_min  # nothing is kept on the loss


# ----------------------------------------------------------------------------- center
def test_center_follows_the_ema_of_the_teacher_rows_in_training_only() -> None:
    torch.manual_seed(3)
    loss = make_loss(4, [0, 1])
    old = torch.randn(1, 6)
    loss.center.copy_(old)
    teacher = torch.randn(10, 6)  # 2 teacher crops of 5 samples: the mean of all 10 rows
    _forward(loss, torch.randn(20, 6), teacher)
    expected = EMA * old + (1 - EMA) * teacher.mean(dim=0, keepdim=True)
    torch.testing.assert_close(loss.center, expected, rtol=0, atol=1e-6)

    loss.eval()
    before = loss.center.clone()
    _forward(loss, torch.randn(20, 6), torch.randn(10, 6))
    assert torch.equal(loss.center, before)
    loss.train()
    _forward(loss, torch.randn(20, 6), torch.randn(10, 6))
    assert not torch.equal(loss.center, before)


def test_the_loss_uses_the_center_before_this_batchs_update() -> None:
    torch.manual_seed(4)
    loss = make_loss(2, [0, 1])
    student, teacher = torch.randn(6, 6), torch.randn(6, 6) * 3
    got = _forward(loss, student, teacher).item()
    assert got == pytest.approx(ref_dino(student, teacher, torch.zeros(6), 2, [0, 1]), rel=1e-5)
    assert loss.center.abs().sum() > 0


# ----------------------------------------------------------------------------- 2 ranks
NUM_CROPS, DIM = 4, 6


def _rank_data(rank: int, b: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(NUM_CROPS * b, DIM, generator=g), torch.randn(2 * b, DIM, generator=g) * 2


def _initial_center() -> torch.Tensor:
    return torch.randn(1, DIM, generator=torch.Generator().manual_seed(7))


def _unequal_worker(rank: int, world: int, sizes: list[int]) -> tuple:
    loss = make_loss(NUM_CROPS, [0, 1], DIM)
    loss.center.copy_(_initial_center())
    s1, t1 = _rank_data(rank, sizes[rank], 1)
    first = _forward(loss, s1, t1).item()
    center1 = loss.center.clone()
    s2, t2 = _rank_data(rank, sizes[rank], 2)
    second = _forward(loss, s2, t2).item()
    return first, second, center1, loss.center.clone()


def test_unequal_batches_on_2_ranks_share_the_center_of_the_global_batch() -> None:
    """Rank 0 holds 3 samples, rank 1 holds 5.

    The center after a step is the EMA towards the mean teacher row of the 8 samples (16
    rows), each row weighted once: not the mean of the two ranks' means. Each rank's loss
    is the one-process loss on its own rows with that shared center.
    """
    sizes = [3, 5]
    results = spawn_gloo(_unequal_worker, 2, sizes)
    (_, _, c1_r0, c2_r0), (_, _, c1_r1, c2_r1) = results
    assert torch.equal(c1_r0, c1_r1) and torch.equal(c2_r0, c2_r1)

    center = _initial_center()
    for step, got in ((1, c1_r0), (2, c2_r0)):
        rows = torch.cat([_rank_data(r, sizes[r], step)[1] for r in range(2)])
        assert rows.shape[0] == 16
        center = EMA * center + (1 - EMA) * rows.mean(dim=0, keepdim=True)
        torch.testing.assert_close(got, center, rtol=0, atol=1e-6)
    # control: the unweighted mean of the ranks' means is measurably different
    means = [_rank_data(r, sizes[r], 1)[1].mean(0, keepdim=True) for r in range(2)]
    unweighted = EMA * _initial_center() + (1 - EMA) * (means[0] + means[1]) / 2
    assert not torch.allclose(unweighted, c1_r0, atol=1e-4)

    for rank, (first, second, center1, _) in enumerate(results):
        single = make_loss(NUM_CROPS, [0, 1], DIM)
        single.center.copy_(_initial_center())
        assert first == pytest.approx(_forward(single, *_rank_data(rank, sizes[rank], 1)))
        s2, t2 = _rank_data(rank, sizes[rank], 2)
        assert second == pytest.approx(ref_dino(s2, t2, center1, NUM_CROPS, [0, 1]), rel=1e-5)


IN_DIM, B = 5, 4


def _student_weights() -> torch.Tensor:
    return torch.randn(DIM, IN_DIM, generator=torch.Generator().manual_seed(11))


def _student_inputs(rank: int) -> torch.Tensor:
    """Rank ``rank``'s inputs, crop-major: (NUM_CROPS * B, IN_DIM)."""
    return torch.randn(NUM_CROPS * B, IN_DIM, generator=torch.Generator().manual_seed(20 + rank))


def _teacher_rows(rank: int) -> torch.Tensor:
    return torch.randn(2 * B, DIM, generator=torch.Generator().manual_seed(40 + rank)) * 2


def _equal_ddp_worker(rank: int, world: int) -> tuple:
    from torch.nn.parallel import DistributedDataParallel as DDP

    student = nn.Linear(IN_DIM, DIM, bias=False)
    with torch.no_grad():
        student.weight.copy_(_student_weights())
    model = DDP(student)
    loss = make_loss(NUM_CROPS, [0, 1], DIM)
    loss.center.copy_(_initial_center())
    out = model(_student_inputs(rank))
    out.retain_grad()
    value = _forward(loss, out, _teacher_rows(rank))
    value.backward()
    return value.item(), out.grad.clone(), student.weight.grad.clone(), loss.center.clone()


def _crop_major_global(per_rank: list[torch.Tensor], crops: int) -> torch.Tensor:
    """The global batch, crop-major: crop 0 of rank 0, crop 0 of rank 1, crop 1 of rank 0..."""
    chunks = [t.chunk(crops) for t in per_rank]
    return torch.cat([chunks[r][c] for c in range(crops) for r in range(len(per_rank))])


def test_equal_batches_on_2_ranks_match_one_process_on_the_global_batch() -> None:
    """Each rank computes the loss of its own B samples (per pair, a mean over B rows);
    one process on the global 2B samples takes the mean over 2B rows. So:

    - the mean over ranks of the losses equals the one-process loss;
    - the gradient of each rank's own output rows is world_size times the one-process
      gradient of those rows (its loss divides by B, the global one by 2B);
    - DDP averages the parameter gradients over the ranks, which gives exactly the
      one-process gradient of the global batch.
    """
    world = 2
    losses, out_grads, w_grads, centers = zip(*spawn_gloo(_equal_ddp_worker, world), strict=True)
    student = nn.Linear(IN_DIM, DIM, bias=False)
    with torch.no_grad():
        student.weight.copy_(_student_weights())
    x = _crop_major_global([_student_inputs(r) for r in range(world)], NUM_CROPS)
    teacher = _crop_major_global([_teacher_rows(r) for r in range(world)], 2)
    single = make_loss(NUM_CROPS, [0, 1], DIM)
    single.center.copy_(_initial_center())
    out = student(x)
    out.retain_grad()
    value = _forward(single, out, teacher)
    value.backward()
    assert value.item() == pytest.approx(
        ref_dino(out.detach(), teacher, _initial_center(), 4, [0, 1])
    )

    assert sum(losses) / world == pytest.approx(value.item(), rel=1e-5)
    for rank in range(world):
        torch.testing.assert_close(w_grads[rank], student.weight.grad, rtol=1e-5, atol=1e-6)
        rows = torch.cat(
            [out.grad.chunk(NUM_CROPS)[c][rank * B : (rank + 1) * B] for c in range(NUM_CROPS)]
        )
        torch.testing.assert_close(out_grads[rank], world * rows, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(centers[rank], single.center, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- schedules
def test_teacher_temperature_warms_up_linearly_then_stays() -> None:
    lo, hi, warm = 0.04, 0.07, 10
    assert teacher_temperature(0, lo, hi, warm) == pytest.approx(lo)
    assert teacher_temperature(5, lo, hi, warm) == pytest.approx((lo + hi) / 2)
    assert teacher_temperature(warm, lo, hi, warm) == pytest.approx(hi)
    assert teacher_temperature(10 * warm, lo, hi, warm) == pytest.approx(hi)
    values = [teacher_temperature(i, lo, hi, warm) for i in range(3 * warm)]
    assert all(a <= b for a, b in itertools.pairwise(values))
    assert all(v == pytest.approx(hi) for v in values[warm:])
    assert teacher_temperature(0, lo, hi, 0) == pytest.approx(hi)  # no warm-up


def test_cosine_momentum_from_base_to_one() -> None:
    base, total = 0.996, 100
    assert cosine_momentum(0, total, base) == pytest.approx(base)
    assert cosine_momentum(total, total, base) == pytest.approx(1.0)
    assert cosine_momentum(total // 2, total, base) == pytest.approx((1 + base) / 2)
    values = [cosine_momentum(i, total, base) for i in range(total + 1)]
    assert all(a < b for a, b in itertools.pairwise(values))
    for i in (1, 17, 63):  # DINO's cosine_scheduler(base, 1, ...)
        assert values[i] == pytest.approx(
            1 + 0.5 * (base - 1) * (1 + math.cos(math.pi * i / total)), rel=1e-12
        )


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("crops", [[0, 4], [], [0, 0], [-1], "01", [True], [0.0, 1.0]])
def test_bad_crops_for_teacher(crops: Any) -> None:
    with pytest.raises(ConfigError, match="crops_for_teacher") as err:
        make_loss(4, crops)
    assert err.value.key_path == f"{KEY}.crops_for_teacher"


@pytest.mark.parametrize(
    "key,value",
    [
        ("student_temp", -0.1),
        ("teacher_temp_min", 0),
        ("teacher_temp_max", -0.07),
        ("momentum", 1.5),
        ("ema_center", -0.1),
        ("teacher_temp_warmup_iters", -1),
        ("output_dim", 0),
        ("num_crops", 1),
    ],
)
def test_bad_numbers_name_their_key(key: str, value: Any) -> None:
    kwargs = {key: value}
    if key == "num_crops":
        kwargs["crops"] = [0]
    with pytest.raises(ConfigError) as err:
        make_loss(**kwargs)
    assert err.value.key_path == f"{KEY}.{key}"
    assert key in str(err.value)


def test_output_dim_that_is_not_the_models_output_width() -> None:
    loss = make_loss(2, [0, 1], dim=64)
    with pytest.raises(ConfigError, match="output_dim") as err:
        loss(torch.randn(4, 32), teacher_output=torch.randn(4, 32))
    assert err.value.key_path == f"{KEY}.output_dim"


@pytest.fixture(scope="module")
def quick_dino_cfg() -> AttrDict:
    from vissl.utils.hydra_config import hydra_compose_and_validate

    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_dino"])
    return cfg


def _head_kwargs(cfg: AttrDict) -> dict[str, Any]:
    ((name, kwargs),) = cfg.MODEL.HEAD.PARAMS
    assert name == "dino_head"
    return kwargs


def test_build_from_the_quick_config_infers_crops_and_output_dim(quick_dino_cfg) -> None:
    cfg = copy.deepcopy(quick_dino_cfg)
    cfg.LOSS.dino_loss.output_dim = 65536  # inferred from the head's num_clusters
    loss = build_loss(cfg.LOSS, cfg)
    assert isinstance(loss, DINOLoss)
    assert loss.num_crops == 4 and loss.output_dim == 64 and loss.crops_for_teacher == [0, 1]
    assert loss.teacher_temp_warmup_iters == 2


def test_normalize_last_layer_disagreeing_with_the_head(quick_dino_cfg) -> None:
    cfg = copy.deepcopy(quick_dino_cfg)
    _head_kwargs(cfg)["normalize_last_layer"] = False
    cfg.LOSS.dino_loss.normalize_last_layer = True
    with pytest.raises(ConfigError, match="normalize_last_layer") as err:
        build_loss(cfg.LOSS, cfg)
    assert err.value.key_path == f"{KEY}.normalize_last_layer"
    cfg.LOSS.dino_loss.normalize_last_layer = False  # agreeing: fine
    assert build_loss(cfg.LOSS, cfg).normalize_last_layer is False


def test_normalize_last_layer_false_against_the_heads_default(quick_dino_cfg) -> None:
    cfg = copy.deepcopy(quick_dino_cfg)
    assert "normalize_last_layer" not in _head_kwargs(cfg)  # the head uses its default, True
    cfg.LOSS.dino_loss.normalize_last_layer = False
    with pytest.raises(ConfigError, match="normalize_last_layer"):
        build_loss(cfg.LOSS, cfg)


def test_a_collator_that_is_not_multicrop(quick_dino_cfg) -> None:
    cfg = copy.deepcopy(quick_dino_cfg)
    cfg.DATA.TRAIN.COLLATE_FUNCTION = "simclr_collator"
    with pytest.raises(ConfigError, match="multicrop_collator") as err:
        build_loss(cfg.LOSS, cfg)
    assert err.value.key_path == "config.DATA.TRAIN.COLLATE_FUNCTION"


def test_crops_for_teacher_beyond_the_transforms_crops(quick_dino_cfg) -> None:
    cfg = copy.deepcopy(quick_dino_cfg)
    cfg.DATA.TRAIN.TRANSFORMS[0]["total_num_crops"] = 2
    cfg.DATA.TRAIN.TRANSFORMS[0]["num_crops"] = [1, 1]
    cfg.LOSS.dino_loss.crops_for_teacher = [0, 2]
    with pytest.raises(ConfigError) as err:
        build_loss(cfg.LOSS, cfg)
    assert err.value.key_path == f"{KEY}.crops_for_teacher"


def test_a_head_with_two_cluster_sizes(quick_dino_cfg) -> None:
    cfg = copy.deepcopy(quick_dino_cfg)
    _head_kwargs(cfg)["num_clusters"] = [64, 32]
    with pytest.raises(ConfigError, match="num_clusters") as err:
        build_loss(cfg.LOSS, cfg)
    assert err.value.key_path == "config.MODEL.HEAD.PARAMS[dino_head].num_clusters"


def test_a_batch_that_is_one_tensor_or_has_other_crops() -> None:
    loss = make_loss(4, [0, 1])
    with pytest.raises(ValueError, match="multicrop_collator"):
        loss.teacher_input(torch.randn(8, 3, 4, 4))
    with pytest.raises(ValueError, match="4 crops"):
        loss.teacher_input([torch.randn(2, 3, 4, 4)] * 3)
    crops = [torch.full((2, 1), float(i)) for i in range(4)]
    assert [int(t[0, 0]) for t in make_loss(4, [1, 0]).teacher_input(crops)] == [1, 0]


# ----------------------------------------------------------------------------- state
def test_center_and_teacher_are_in_the_state_dict() -> None:
    torch.manual_seed(5)
    loss = make_loss(2, [0, 1])
    assert list(loss.state_dict()) == ["center"]
    model = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6))
    loss.bind_model(model)
    _forward(loss, torch.randn(4, 6), torch.randn(4, 6))
    state = loss.state_dict()
    assert {"center", "teacher.0.weight", "teacher.0.bias", "teacher.1.running_mean"} <= set(state)
    fresh = make_loss(2, [0, 1])
    fresh.bind_model(nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6)))
    fresh.load_state_dict(state)
    assert torch.equal(fresh.center, loss.center) and fresh.center.abs().sum() > 0
    for (name, a), b in zip(
        loss.teacher.state_dict().items(), fresh.teacher.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name

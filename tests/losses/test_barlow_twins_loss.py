"""barlow_twins_loss: the paper's formula written here, invariance to an affine change of
either view (and a control showing that normalising the views jointly is not invariant),
2 ranks against 1 process on the global batch (loss and gradients), config errors."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses.barlow_twins_loss import BarlowTwinsLoss, standardize
from vissl.losses.build import build_loss
from vissl.utils.test_utils import spawn_gloo

KEY = "config.LOSS.barlow_twins_loss"
LAMBDA, SCALE, EPS = 0.0051, 0.024, 1e-5


# ----------------------------------------------------------------------------- reference
def _bn(z: torch.Tensor) -> list[list[float]]:
    """BatchNorm1d(affine=False) in training mode, with loops: per column, mean 0 and
    biased variance 1 over the batch (eps = 1e-5 added to the variance)."""
    n, d = z.shape
    out = [[0.0] * d for _ in range(n)]
    for j in range(d):
        col = [float(z[i, j]) for i in range(n)]
        mean = sum(col) / n
        var = sum((v - mean) ** 2 for v in col) / n
        for i in range(n):
            out[i][j] = (col[i] - mean) / (var + EPS) ** 0.5
    return out


def ref_barlow_twins(
    z_a: torch.Tensor, z_b: torch.Tensor, lambda_: float = LAMBDA, scale: float = SCALE
) -> float:
    """Zbontar et al. 2021, Alg. 1: c = bn(z_a).T bn(z_b) / N;
    loss = scale * (sum_i (1 - c_ii)^2 + lambda * sum_{i != j} c_ij^2)."""
    a, b = _bn(z_a.double()), _bn(z_b.double())
    n, d = z_a.shape
    total = 0.0
    for i in range(d):
        for j in range(d):
            c_ij = sum(a[k][i] * b[k][j] for k in range(n)) / n
            total += (1 - c_ij) ** 2 if i == j else lambda_ * c_ij**2
    return scale * total


def joint_barlow_twins(z_a: torch.Tensor, z_b: torch.Tensor) -> float:
    """The same loss with the two views standardised TOGETHER (statistics over 2N rows)."""
    n = z_a.shape[0]
    z = standardize(torch.cat([z_a, z_b]).double(), EPS)
    c = z[:n].t() @ z[n:] / n
    on = (1 - torch.diagonal(c)).pow(2).sum()
    off = c.pow(2).sum() - torch.diagonal(c).pow(2).sum()
    return float(SCALE * (on + LAMBDA * off))


def make_loss(dim: int = 6, **kw: Any) -> BarlowTwinsLoss:
    return BarlowTwinsLoss(
        lambda_=kw.pop("lambda_", LAMBDA), scale_loss=SCALE, embedding_dim=dim, **kw
    )


def _views(n: int = 8, d: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z_a = torch.randn(n, d, generator=g) * 3
    z_b = z_a + torch.randn(n, d, generator=g) * 2  # correlated with view A
    return z_a, z_b


# ----------------------------------------------------------------------------- formula
@pytest.mark.parametrize("lambda_", [LAMBDA, 0.0, 0.5])
def test_loss_matches_the_papers_formula(lambda_: float) -> None:
    z_a, z_b = _views()
    got = make_loss(lambda_=lambda_)(torch.cat([z_a, z_b])).item()
    assert got == pytest.approx(ref_barlow_twins(z_a, z_b, lambda_), rel=1e-5)


def test_the_papers_code_with_batchnorm1d_gives_the_same() -> None:
    z_a, z_b = _views(seed=1)
    bn = nn.BatchNorm1d(6, affine=False)
    c = bn(z_a).t() @ bn(z_b) / 8
    on = torch.diagonal(c).add(-1).pow(2).sum()
    off = (c.pow(2).sum() - torch.diagonal(c).pow(2).sum()) * LAMBDA
    assert make_loss()(torch.cat([z_a, z_b])).item() == pytest.approx(
        float(SCALE * (on + off)), rel=1e-5
    )


def test_a_list_of_the_two_views_is_the_same_batch() -> None:
    z_a, z_b = _views(seed=2)
    loss = make_loss()
    assert loss([z_a, z_b]).item() == loss([torch.cat([z_a, z_b])]).item()


# ----------------------------------------------------------------------------- invariance
def test_invariant_to_an_affine_change_of_one_view() -> None:
    z_a, z_b = _views(seed=3)
    loss = make_loss()
    same = loss(torch.cat([z_a, z_a])).item()
    assert loss(torch.cat([z_a, 2 * z_a + 4])).item() == pytest.approx(same, rel=1e-5)
    base = loss(torch.cat([z_a, z_b])).item()
    scale = torch.rand(6, generator=torch.Generator().manual_seed(4)) * 3 + 0.5  # per column > 0
    shift = torch.randn(6)
    assert loss(torch.cat([z_a * scale + shift, z_b])).item() == pytest.approx(base, rel=1e-5)
    assert loss(torch.cat([z_a, z_b * scale - shift])).item() == pytest.approx(base, rel=1e-5)


def test_control_normalising_the_views_jointly_is_not_invariant() -> None:
    """The test above fails for VISSL's joint normalisation: its loss changes under the
    same affine change of one view (by far more than the tolerance)."""
    z_a, z_b = _views(seed=3)
    same = joint_barlow_twins(z_a, z_a)
    assert joint_barlow_twins(z_a, 2 * z_a + 4) != pytest.approx(same, rel=1e-2)
    assert joint_barlow_twins(2 * z_a + 4, z_b) != pytest.approx(
        joint_barlow_twins(z_a, z_b), rel=1e-2
    )
    # the joint version agrees with the per-view one when the views share their statistics
    assert joint_barlow_twins(z_a, z_a) == pytest.approx(ref_barlow_twins(z_a, z_a), rel=1e-5)


# ----------------------------------------------------------------------------- 2 ranks
WORLD, B, IN_DIM, DIM = 2, 4, 5, 6


def _inputs(rank: int) -> torch.Tensor:
    """Rank ``rank``'s (2 * B, IN_DIM) inputs, view-major: its B view-A rows, then view B."""
    g = torch.Generator().manual_seed(30 + rank)
    x_a = torch.randn(B, IN_DIM, generator=g)
    return torch.cat([x_a, x_a + 0.5 * torch.randn(B, IN_DIM, generator=g)])


def _weights() -> torch.Tensor:
    return torch.randn(DIM, IN_DIM, generator=torch.Generator().manual_seed(9))


def _global_batch() -> torch.Tensor:
    """One process's view-major batch: view A of rank 0 then rank 1, then their view B."""
    per_rank = [_inputs(r) for r in range(WORLD)]
    return torch.cat([x[:B] for x in per_rank] + [x[B:] for x in per_rank])


def _ddp_worker(rank: int, world: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = nn.Linear(IN_DIM, DIM, bias=False)
    with torch.no_grad():
        model.weight.copy_(_weights())
    ddp = DDP(model)
    z = ddp(_inputs(rank))
    z.retain_grad()
    loss = make_loss(DIM)(z)
    loss.backward()
    return loss.item(), z.grad.clone(), model.weight.grad.clone()


def test_two_ranks_match_one_process_on_the_global_batch() -> None:
    """Every rank computes the loss of the gathered global batch, so each rank's loss is
    the one-process loss. The gather's backward sums over ranks the gradient every rank's
    (identical) loss sends to a row, so a rank's embedding gradient is world_size times the
    one-process gradient of its rows, and DDP's average over ranks then gives each
    parameter exactly the one-process gradient (not 1 / world_size of it)."""
    results = spawn_gloo(_ddp_worker, WORLD)
    model = nn.Linear(IN_DIM, DIM, bias=False)
    with torch.no_grad():
        model.weight.copy_(_weights())
    z = model(_global_batch())
    z.retain_grad()
    single = make_loss(DIM)(z)
    single.backward()
    assert single.item() == pytest.approx(
        ref_barlow_twins(z.detach()[: WORLD * B], z.detach()[WORLD * B :]), rel=1e-5
    )
    n = WORLD * B
    for rank, (value, z_grad, w_grad) in enumerate(results):
        assert value == pytest.approx(single.item(), rel=1e-5)
        own_rows = torch.cat(
            [z.grad[rank * B : (rank + 1) * B], z.grad[n + rank * B : n + (rank + 1) * B]]
        )
        torch.testing.assert_close(z_grad, WORLD * own_rows, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(w_grad, model.weight.grad, rtol=1e-5, atol=1e-7)
    # a gradient far above atol, so 1 / world_size of it would fail the comparison
    assert model.weight.grad.abs().max() > 1000 * 1e-7


# ----------------------------------------------------------------------------- config
def test_odd_rows_and_embedding_dim_mismatch() -> None:
    loss = make_loss(6)
    with pytest.raises(ValueError, match=r"\(2 \* B, D\)"):
        loss(torch.randn(7, 6))
    with pytest.raises(ConfigError, match="embedding_dim is 6") as err:
        loss(torch.randn(8, 5))
    assert err.value.key_path == f"{KEY}.embedding_dim"


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"lambda_": -0.1}, "lambda_"),
        ({"scale_loss": 0}, "scale_loss"),
        ({"embedding_dim": 0}, "embedding_dim"),
    ],
)
def test_bad_numbers_name_their_key(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        BarlowTwinsLoss(**kwargs)
    assert err.value.key_path == f"{KEY}.{key}"


@pytest.fixture(scope="module")
def quick_cfg() -> AttrDict:
    from vissl.utils.hydra_config import hydra_compose_and_validate

    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_barlow_twins"])
    return cfg


def test_embedding_dim_is_inferred_from_the_head(quick_cfg) -> None:
    cfg = copy.deepcopy(quick_cfg)
    cfg.LOSS.barlow_twins_loss.embedding_dim = 8192
    loss = build_loss(cfg.LOSS, cfg)
    assert isinstance(loss, BarlowTwinsLoss) and loss.embedding_dim == 64
    assert loss.lambda_ == LAMBDA and loss.scale_loss == SCALE


@pytest.mark.parametrize(
    "transform",
    [
        {"name": "ImgReplicatePil", "num_times": 3},
        {
            "name": "ImgPilToMultiCrop",
            "total_num_crops": 3,
            "size_crops": [16, 8],
            "num_crops": [2, 1],
            "crop_scales": [[0.4, 1], [0.1, 0.4]],
        },
    ],
)
def test_transforms_making_3_views(quick_cfg, transform: dict[str, Any]) -> None:
    cfg = copy.deepcopy(quick_cfg)
    cfg.DATA.TRAIN.TRANSFORMS[0] = transform
    with pytest.raises(ConfigError, match="exactly 2 views") as err:
        build_loss(cfg.LOSS, cfg)
    assert err.value.key_path == "config.DATA.TRAIN.TRANSFORMS"

"""vicreg_loss: the formula written here with loops (the VICReg code's normalisation) and
its relation to the paper's equations, invariances (identical views, shifts), collapse,
the logged terms, fp32 under autocast, no host reads, 2 ranks against 1 process on the
global batch (loss, terms, embedding and parameter gradients, and the code's per-rank
invariance giving the same gradients), config errors."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses.build import build_loss
from vissl.losses.vicreg_loss import VICRegLoss
from vissl.utils.test_utils import spawn_gloo

KEY = "config.LOSS.vicreg_loss"
SIM, STD, COV, EPS = 25.0, 25.0, 1.0, 1e-4


# ----------------------------------------------------------------------------- reference
def _columns(z: torch.Tensor) -> list[list[float]]:
    n, d = z.shape
    return [[float(z[i, k]) for i in range(n)] for k in range(d)]


def _var_unbiased(col: list[float]) -> float:
    mean = sum(col) / len(col)
    return sum((v - mean) ** 2 for v in col) / (len(col) - 1)


def ref_terms(z_a: torch.Tensor, z_b: torch.Tensor, eps: float = EPS) -> tuple[float, ...]:
    """Bardes et al. 2022 as the released code computes them, with loops:
    inv = mean over the N x D entries of (z - z')^2;
    v(Z) = 1/D sum_k max(0, 1 - sqrt(Var(z^k) + eps)) (unbiased variance), var = mean of v;
    C(Z) = 1/(N-1) sum_i (z_i - mean)(z_i - mean)^T, c(Z) = 1/D sum_{k != l} C_kl^2,
    cov = c(Z) + c(Z')."""
    n, d = z_a.shape
    inv = sum((float(z_a[i, k]) - float(z_b[i, k])) ** 2 for i in range(n) for k in range(d))
    inv /= n * d

    def v(z: torch.Tensor) -> float:
        return sum(max(0.0, 1.0 - math.sqrt(_var_unbiased(c) + eps)) for c in _columns(z)) / d

    def c(z: torch.Tensor) -> float:
        cols = _columns(z)
        means = [sum(col) / n for col in cols]
        total = 0.0
        for k in range(d):
            for m in range(d):
                if k != m:
                    cov = sum((cols[k][i] - means[k]) * (cols[m][i] - means[m]) for i in range(n))
                    total += (cov / (n - 1)) ** 2
        return total / d

    return inv, (v(z_a) + v(z_b)) / 2, c(z_a) + c(z_b)


def ref_vicreg(
    z_a: torch.Tensor, z_b: torch.Tensor, sim: float = SIM, std: float = STD, cov: float = COV
) -> float:
    inv, var, co = ref_terms(z_a, z_b)
    return sim * inv + std * var + cov * co


def paper_equations(
    z_a: torch.Tensor, z_b: torch.Tensor, lam: float, mu: float, nu: float
) -> float:
    """The paper's eq. 6: lam * s(Z, Z') + mu * (v(Z) + v(Z')) + nu * (c(Z) + c(Z')), with
    s(Z, Z') = 1/N sum_i ||z_i - z'_i||^2 (summed over the dimensions)."""
    s = float(((z_a - z_b) ** 2).sum(dim=1).mean())
    _, var, co = ref_terms(z_a, z_b)
    return lam * s + mu * (2 * var) + nu * co


def make_loss(dim: int = 6, **kw: Any) -> VICRegLoss:
    return VICRegLoss(embedding_dim=dim, **kw)


def value(loss: VICRegLoss, *args: Any) -> float:
    return float(loss(*args)["loss"])


def _views(n: int = 8, d: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z_a = torch.randn(n, d, generator=g) * 0.7  # std below 1: the hinge is active
    z_b = z_a + torch.randn(n, d, generator=g) * 0.3
    z_a[:, 0] *= 3  # one dimension above the hinge
    return z_a, z_b


# ----------------------------------------------------------------------------- formula
@pytest.mark.parametrize("coeffs", [(SIM, STD, COV), (1.0, 0.0, 0.0), (0.0, 2.0, 0.5)])
def test_loss_matches_the_formula(coeffs: tuple[float, float, float]) -> None:
    z_a, z_b = _views()
    sim, std, cov = coeffs
    loss = make_loss(sim_coeff=sim, std_coeff=std, cov_coeff=cov)
    out = loss(torch.cat([z_a, z_b]))
    assert float(out["loss"]) == pytest.approx(ref_vicreg(z_a, z_b, sim, std, cov), rel=1e-5)
    inv, var, co = ref_terms(z_a, z_b)
    assert float(out["invariance"]) == pytest.approx(inv, rel=1e-5)
    assert float(out["variance"]) == pytest.approx(var, rel=1e-5)
    assert float(out["covariance"]) == pytest.approx(co, rel=1e-5)
    assert 0 < var < 1 and co > 0 and inv > 0  # every term is exercised


def test_relation_to_the_papers_equations() -> None:
    """The code's loss with (sim, std, cov) is the paper's eq. 6 with lambda = sim / D
    (mse_loss averages over the dimensions, s sums them) and mu = std / 2 (the code
    averages the two views' variance terms; the paper adds them)."""
    z_a, z_b = _views(seed=1)
    d = z_a.shape[1]
    assert value(make_loss(), torch.cat([z_a, z_b])) == pytest.approx(
        paper_equations(z_a, z_b, lam=SIM / d, mu=STD / 2, nu=COV), rel=1e-5
    )


def test_the_released_codes_expressions_give_the_same() -> None:
    """The code's own tensor expressions (one process): F.mse_loss, torch.var, x.T @ x."""
    z_a, z_b = _views(seed=2)
    n, d = z_a.shape
    x, y = z_a - z_a.mean(dim=0), z_b - z_b.mean(dim=0)
    std_loss = F.relu(1 - torch.sqrt(x.var(dim=0) + EPS)).mean() / 2
    std_loss = std_loss + F.relu(1 - torch.sqrt(y.var(dim=0) + EPS)).mean() / 2
    off = ~torch.eye(d, dtype=torch.bool)
    cov_loss = ((x.T @ x) / (n - 1))[off].pow(2).sum() / d + ((y.T @ y) / (n - 1))[off].pow(
        2
    ).sum() / d
    expected = SIM * F.mse_loss(z_a, z_b) + STD * std_loss + COV * cov_loss
    assert value(make_loss(), torch.cat([z_a, z_b])) == pytest.approx(float(expected), rel=1e-6)


def test_a_list_of_the_two_views_is_the_same_batch() -> None:
    z_a, z_b = _views(seed=3)
    loss = make_loss()
    assert value(loss, [z_a, z_b]) == value(loss, [torch.cat([z_a, z_b])])
    assert value(loss, [z_a, z_b]) == value(loss, torch.cat([z_a, z_b]))


# ----------------------------------------------------------------------------- invariances
def test_identical_views() -> None:
    """No invariance term; the variance and covariance of one view, counted twice."""
    z_a, _ = _views(seed=4)
    out = make_loss()(torch.cat([z_a, z_a]))
    _, var, co = ref_terms(z_a, z_a)
    assert float(out["invariance"]) == 0.0
    assert float(out["variance"]) == pytest.approx(ref_terms(z_a, z_a)[1], rel=1e-6)
    assert float(out["loss"]) == pytest.approx(STD * var + COV * co, rel=1e-6)


def test_shifts_change_only_what_they_should() -> None:
    """Shifting both views by the same per-dimension constant changes nothing; shifting
    one view changes the invariance only (variance and covariance are centred)."""
    z_a, z_b = _views(seed=5)
    shift = (
        torch.randn(
            6,
            generator=torch.Generator().manual_seed(6),
        )
        * 5
    )
    loss = make_loss()
    base = loss(torch.cat([z_a, z_b]))
    both = loss(torch.cat([z_a + shift, z_b + shift]))
    one = loss(torch.cat([z_a + shift, z_b]))
    for key in ("loss", "invariance", "variance", "covariance"):
        assert float(both[key]) == pytest.approx(float(base[key]), rel=1e-5)
    for key in ("variance", "covariance"):
        assert float(one[key]) == pytest.approx(float(base[key]), rel=1e-5)
    expected_inv = float(F.mse_loss(z_a + shift, z_b))
    assert float(one["invariance"]) == pytest.approx(expected_inv, rel=1e-6)
    assert float(one["invariance"]) > 2 * float(base["invariance"])


def test_swapping_the_views_and_permuting_samples_change_nothing() -> None:
    z_a, z_b = _views(seed=7)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(8))
    loss = make_loss()
    base = value(loss, torch.cat([z_a, z_b]))
    assert value(loss, torch.cat([z_b, z_a])) == pytest.approx(base, rel=1e-6)
    assert value(loss, torch.cat([z_a[perm], z_b[perm]])) == pytest.approx(base, rel=1e-6)


def test_collapse_and_decorrelated_unit_variance() -> None:
    """Constant embeddings: the hinge is 1 - sqrt(eps) in every dimension, the gradient
    stays finite (eps); uncorrelated columns of std >= 1 cost nothing but invariance."""
    z = torch.full((8, 6), 3.0, requires_grad=True)
    out = make_loss()(torch.cat([z, z]))
    assert float(out["variance"]) == pytest.approx(1 - math.sqrt(EPS), rel=1e-6)
    assert float(out["covariance"]) == 0.0
    out["loss"].backward()
    assert z.grad is not None and torch.isfinite(z.grad).all()
    # +-2 patterns orthogonal over the rows: zero covariance, std > 1
    h = torch.tensor([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]).float()
    z = torch.cat([h[:, 1:], -h[:, 1:]]) * 2  # 8 x 3, mean 0, orthogonal columns
    out = make_loss(3)(torch.cat([z, z]))
    assert float(out["loss"]) == pytest.approx(0.0, abs=1e-12)


def test_terms_are_detached_and_the_loss_is_not() -> None:
    z = torch.randn(8, 6, requires_grad=True)
    out = make_loss()(z)
    assert set(out) == {"loss", "invariance", "variance", "covariance"}
    assert out["loss"].requires_grad
    assert not any(out[k].requires_grad for k in ("invariance", "variance", "covariance"))
    assert all(out[k].shape == () for k in out)


def test_fp32_under_a_bf16_autocast() -> None:
    z = torch.randn(16, 6) * 0.5
    loss = make_loss()
    expected = loss(z)["loss"]
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        got = loss(z)["loss"]
        got_half = loss(z.bfloat16())["loss"]
    assert got.dtype == torch.float32 and torch.equal(got, expected)
    assert got_half.dtype == torch.float32


# ----------------------------------------------------------------------------- host reads
def test_a_step_and_its_logging_read_nothing_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loss, its backward and the train step's handling of the dict (loss to
    backpropagate, the terms stacked for the one logging all-reduce) never turn a tensor
    into a Python value: the log hooks read them on log iterations only."""
    from vissl.trainer.train_steps.standard_train_step import LastBatchInfo, StandardTrainStep

    model = nn.Linear(5, 6)
    loss = make_loss()
    task = SimpleNamespace(
        loss=loss, last_batch=LastBatchInfo(), additional_log_data={}, world_size=1
    )
    step = StandardTrainStep()
    x = torch.randn(8, 5)

    def refuse(self: torch.Tensor, *args: Any) -> Any:
        raise AssertionError("a host read of a tensor during the step")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    local = step.compute_loss(task, model(x), {"target": None})  # type: ignore[arg-type]
    step.reduce_loss_for_logging(task, local)  # type: ignore[arg-type]
    local.backward()
    monkeypatch.undo()
    assert set(task.additional_log_data) == {"loss.invariance", "loss.variance", "loss.covariance"}
    out = loss(model(x))
    assert torch.equal(task.last_batch.loss, out["loss"].detach())
    for key in ("invariance", "variance", "covariance"):
        assert torch.equal(task.additional_log_data[f"loss.{key}"], out[key])


# ----------------------------------------------------------------------------- 2 ranks
WORLD, B, IN_DIM, DIM = 2, 4, 5, 6


def _inputs(rank: int) -> torch.Tensor:
    """Rank ``rank``'s (2 * B, IN_DIM) inputs, view-major: its B view-1 rows, then view 2."""
    g = torch.Generator().manual_seed(40 + rank)
    x_a = torch.randn(B, IN_DIM, generator=g)
    return torch.cat([x_a, x_a + 0.5 * torch.randn(B, IN_DIM, generator=g)])


def _model() -> nn.Linear:
    model = nn.Linear(IN_DIM, DIM)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        model.weight.copy_(torch.randn(DIM, IN_DIM, generator=g) * 0.4)
        model.bias.copy_(torch.randn(DIM, generator=g))
    return model


def _global_batch() -> torch.Tensor:
    """One process's view-major batch: view 1 of rank 0 then rank 1, then their view 2."""
    per_rank = [_inputs(r) for r in range(WORLD)]
    return torch.cat([x[:B] for x in per_rank] + [x[B:] for x in per_rank])


def _code_style_loss(z: torch.Tensor) -> torch.Tensor:
    """The released code's arrangement: the invariance on this rank's own rows, the other
    terms on the rows gathered with gradients."""
    from vissl.utils.distributed import gather_from_all

    a, b = z.chunk(2)
    ga, gb = gather_from_all(a), gather_from_all(b)
    n = ga.shape[0]
    x, y = ga - ga.mean(dim=0), gb - gb.mean(dim=0)
    std_loss = F.relu(1 - torch.sqrt(x.var(dim=0) + EPS)).mean() / 2
    std_loss = std_loss + F.relu(1 - torch.sqrt(y.var(dim=0) + EPS)).mean() / 2
    off = ~torch.eye(DIM, dtype=torch.bool)
    cov_x, cov_y = (x.T @ x) / (n - 1), (y.T @ y) / (n - 1)
    cov_loss = (cov_x[off].pow(2).sum() + cov_y[off].pow(2).sum()) / DIM
    return SIM * F.mse_loss(a, b) + STD * std_loss + COV * cov_loss


def _ddp_worker(rank: int, world: int) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model()
    ddp = DDP(model)
    z = ddp(_inputs(rank))
    z.retain_grad()
    out = make_loss(DIM)(z)
    out["loss"].backward()
    z2 = _model()(_inputs(rank))
    (code_grad,) = torch.autograd.grad(_code_style_loss(z2), z2)
    return {
        "terms": {k: float(v) for k, v in out.items()},
        "z_grad": z.grad.clone(),
        "code_z_grad": code_grad,
        "grads": [p.grad.clone() for p in model.parameters()],
    }


def test_two_ranks_match_one_process_on_the_global_batch() -> None:
    """Every rank computes the loss of the gathered global batch, so each rank's loss and
    terms are the one-process ones. The gather's backward sums over ranks the gradient
    every rank's (identical) loss sends to a row, so a rank's embedding gradient is
    world_size times the one-process gradient of its rows, and DDP's average over ranks
    then gives each parameter exactly the one-process gradient (not 1 / world_size of it).
    The released code's per-rank invariance sends the same gradient to a rank's rows."""
    results = spawn_gloo(_ddp_worker, WORLD)
    model = _model()
    z = model(_global_batch())
    z.retain_grad()
    single = make_loss(DIM)(z)
    single["loss"].backward()
    n = WORLD * B
    assert float(single["loss"].detach()) == pytest.approx(
        ref_vicreg(z.detach()[:n].double(), z.detach()[n:].double()), rel=1e-5
    )
    for rank, result in enumerate(results):
        for key, v in result["terms"].items():
            assert v == pytest.approx(float(single[key].detach()), rel=1e-5), key
        own_rows = torch.cat(
            [z.grad[rank * B : (rank + 1) * B], z.grad[n + rank * B : n + (rank + 1) * B]]
        )
        torch.testing.assert_close(result["z_grad"], WORLD * own_rows, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(result["code_z_grad"], result["z_grad"], rtol=1e-5, atol=1e-7)
        for got, expected in zip(result["grads"], [p.grad for p in model.parameters()]):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # weight gradients far above atol, so 1 / world_size of them would fail the comparison
    assert model.weight.grad is not None and model.weight.grad.abs().max() > 1000 * 1e-6
    # the bias shifts both views alike: only rounding reaches it (centred terms, equal shift)
    assert model.bias.grad is not None and model.bias.grad.abs().max() < 1e-5


# ----------------------------------------------------------------------------- config
def test_rows_widths_and_batch_size_are_checked() -> None:
    loss = make_loss(6)
    with pytest.raises(ValueError, match=r"\(2 \* B, D\)"):
        loss(torch.randn(7, 6))
    with pytest.raises(ValueError, match="two views"):
        loss([torch.randn(4, 6), torch.randn(3, 6)])
    with pytest.raises(ValueError, match="one output tensor"):
        loss([torch.randn(4, 6)] * 3)
    with pytest.raises(ConfigError, match="embedding_dim is 6") as err:
        loss(torch.randn(8, 5))
    assert err.value.key_path == f"{KEY}.embedding_dim"
    with pytest.raises(ValueError, match="at least 2 samples"):
        loss(torch.randn(2, 6))


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"sim_coeff": -1.0}, "sim_coeff"),
        ({"std_coeff": -0.1}, "std_coeff"),
        ({"cov_coeff": float("nan")}, "cov_coeff"),
        ({"cov_coeff": float("inf")}, "cov_coeff"),
        ({"sim_coeff": "25"}, "sim_coeff"),
        ({"std_coeff": True}, "std_coeff"),
        ({"eps": 0.0}, "eps"),
        ({"eps": -1e-4}, "eps"),
        ({"embedding_dim": 0}, "embedding_dim"),
        ({"embedding_dim": 8.0}, "embedding_dim"),
        ({"sim_coeff": 0, "std_coeff": 0.0, "cov_coeff": 0}, "sim_coeff"),
    ],
)
def test_bad_numbers_name_their_key(kwargs: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        VICRegLoss(**kwargs)
    assert err.value.key_path == f"{KEY}.{key}"


def test_zero_weights_are_allowed_while_one_is_positive() -> None:
    loss = VICRegLoss(sim_coeff=0, std_coeff=25, cov_coeff=0, embedding_dim=6)
    z_a, z_b = _views(seed=10)
    assert value(loss, torch.cat([z_a, z_b])) == pytest.approx(
        25 * ref_terms(z_a, z_b)[1], rel=1e-5
    )


@pytest.fixture(scope="module")
def quick_cfg() -> AttrDict:
    from vissl.utils.hydra_config import hydra_compose_and_validate

    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_vicreg"])
    return cfg


def test_defaults_and_embedding_dim_from_the_head(quick_cfg) -> None:
    cfg = copy.deepcopy(quick_cfg)
    params = cfg.LOSS.vicreg_loss
    assert dict(params) == {
        "sim_coeff": 25.0,
        "std_coeff": 25.0,
        "cov_coeff": 1.0,
        "eps": 0.0001,
        "embedding_dim": 64,  # written by the config stage: the head's output width
    }
    loss = build_loss(cfg.LOSS, cfg)
    assert isinstance(loss, VICRegLoss) and loss.embedding_dim == 64
    assert (loss.sim_coeff, loss.std_coeff, loss.cov_coeff, loss.eps) == (SIM, STD, COV, EPS)
    assert VICRegLoss.from_config({}).embedding_dim == 8192


def test_a_bad_coefficient_in_the_config_names_its_key(quick_cfg) -> None:
    cfg = copy.deepcopy(quick_cfg)
    cfg.LOSS.vicreg_loss.std_coeff = -25.0
    with pytest.raises(ConfigError) as err:
        build_loss(cfg.LOSS, cfg)
    assert err.value.key_path == f"{KEY}.std_coeff"


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

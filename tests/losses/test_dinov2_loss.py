"""dinov2_loss: DINOv2's loss written here in float64 (DINO [CLS] + masked patch + KoLeo
terms, centred or Sinkhorn-Knopp targets) against ours, on every patch or on the masked
patches only; 2 gloo ranks against 1 for what spans ranks (Sinkhorn-Knopp over the global
rows, centers over the global masked rows) and for what does not (KoLeo is per rank, as in
DINOv2); schedules and config errors."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses.build import build_loss
from vissl.losses.dinov2_loss import DINOv2Loss, linear_warmup
from vissl.utils.hydra_config import hydra_compose_and_validate
from vissl.utils.test_utils import spawn_gloo

KEY = "config.LOSS.dinov2_loss"
TAU_S, TAU_T = 0.1, 0.05
G, LC, K, D, L = 2, 2, 5, 4, 6
EPS = 1e-8


# ----------------------------------------------------------------------------- reference
def _softmax(x: list[float]) -> list[float]:
    m = max(x)
    e = [math.exp(v - m) for v in x]
    return [v / sum(e) for v in e]


def _ce(p: list[float], s: list[float]) -> float:
    z = [v / TAU_S for v in s]
    m = max(z)
    log_z = m + math.log(sum(math.exp(v - m) for v in z))
    return -sum(a * (b - log_z) for a, b in zip(p, z))


def ref_sinkhorn(logits: list[list[float]], tau: float, iters: int = 3) -> list[list[float]]:
    """DINOv2's sinkhorn_knopp_teacher on the whole (global) matrix, float64 loops."""
    b, k = len(logits), len(logits[0])
    q = [[math.exp(logits[i][j] / tau) for i in range(b)] for j in range(k)]  # K x B
    total = sum(map(sum, q))
    q = [[v / total for v in row] for row in q]
    for _ in range(iters):
        q = [[v / sum(row) / k for v in row] for row in q]
        cols = [sum(q[j][i] for j in range(k)) for i in range(b)]
        q = [[q[j][i] / cols[i] / b for i in range(b)] for j in range(k)]
    return [[q[j][i] * b for j in range(k)] for i in range(b)]


def ref_koleo(x: list[list[float]]) -> float:
    """KoLeo (Sablayrolles et al. 2019; DINOv2's KoLeoLoss): normalise, nearest other row by
    inner product, -mean log(||x_i - x_nn + eps|| + eps)."""
    xs = []
    for row in x:
        n = max(math.sqrt(sum(v * v for v in row)), EPS)
        xs.append([v / n for v in row])
    total = 0.0
    for i, xi in enumerate(xs):
        best = max(
            (j for j in range(len(xs)) if j != i),
            key=lambda j: sum(a * b for a, b in zip(xi, xs[j])),
        )
        d = math.sqrt(sum((a - b + EPS) ** 2 for a, b in zip(xi, xs[best])))
        total += -math.log(d + EPS)
    return total / len(xs)


def ref_dinov2(batch: dict[str, Any], centering: str, center: Any, patch_center: Any,
               weights: tuple[float, float, float] = (1.0, 0.1, 1.0)) -> dict[str, float]:  # fmt: skip
    """DINOv2's SSLMetaArch.forward_backward in float64 loops (one process)."""
    s_cls = batch["s_cls"].double().tolist()
    s_loc = batch["s_local"].double().tolist()
    t_cls = batch["t_cls"].double().tolist()
    m = batch["mask"].reshape(batch["mask"].shape[0], -1).tolist()
    s_patch, t_patch = batch["s_patch"].double().tolist(), batch["t_patch"].double().tolist()
    rows = [(i, j) for i in range(len(m)) for j in range(len(m[i])) if m[i][j]]
    t_rows = [t_patch[i][j] for i, j in rows]
    if centering == "sinkhorn_knopp":
        p_cls, p_rows = ref_sinkhorn(t_cls, TAU_T), ref_sinkhorn(t_rows, TAU_T)
    else:
        c, pc = center.double().reshape(-1).tolist(), patch_center.double().reshape(-1).tolist()
        p_cls = [_softmax([(a - b) / TAU_T for a, b in zip(r, c)]) for r in t_cls]
        p_rows = [_softmax([(a - b) / TAU_T for a, b in zip(r, pc)]) for r in t_rows]
    b = len(s_cls) // G
    crops = [s_cls[v * b : (v + 1) * b] for v in range(G)]
    crops += [s_loc[v * b : (v + 1) * b] for v in range(len(s_loc) // b)]
    dino, pairs = 0.0, 0
    for q in range(G):
        for v in range(len(crops)):
            if v != q:
                dino += sum(_ce(p_cls[q * b + i], crops[v][i]) for i in range(b)) / b
                pairs += 1
    dino /= pairs
    ibot = sum(_ce(p, s_patch[i][j]) / sum(m[i]) for p, (i, j) in zip(p_rows, rows)) / len(m)
    tokens = batch["tokens"].double().tolist()
    koleo = sum(ref_koleo(tokens[q * b : (q + 1) * b]) for q in range(G))
    total = weights[0] * dino + weights[1] * koleo + weights[2] * ibot
    return {"loss": total, "dino_loss": dino, "koleo_loss": koleo, "ibot_loss": ibot}


def make_loss(**kw: Any) -> DINOv2Loss:
    args: dict[str, Any] = dict(
        student_temp=TAU_S,
        warmup_teacher_temp=TAU_T,
        teacher_temp=TAU_T,
        warmup_teacher_temp_iters=0,
        num_global_crops=G,
        num_local_crops=LC,
        out_dim=K,
        patch_out_dim=K,
    )
    args.update(kw)
    loss = DINOv2Loss(**args)
    loss.set_schedule_position(0, 0)
    return loss


def make_batch(b: int, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(G * b, 2, 3, generator=g) < 0.4
    mask[0] = False
    mask[1, 0, 0] = True
    return {
        "s_cls": torch.randn(G * b, K, generator=g),
        "s_patch": torch.randn(G * b, L, K, generator=g),
        "s_local": torch.randn(LC * b, K, generator=g),
        "tokens": torch.randn(G * b, D, generator=g),
        "t_cls": torch.randn(G * b, K, generator=g),
        "t_patch": torch.randn(G * b, L, K, generator=g),
        "mask": mask,
    }


def run(loss: DINOv2Loss, batch: dict[str, Any], masked_only: bool = False) -> dict[str, Any]:
    flat = batch["mask"].reshape(batch["mask"].shape[0], -1)
    s_patch, t_patch = batch["s_patch"], batch["t_patch"]
    if masked_only:  # what ibot_head gives with masked_patches_only
        s_patch, t_patch = s_patch[flat], t_patch[flat]
    return loss(
        [[batch["s_cls"], s_patch, batch["tokens"]], [batch["s_local"]]],
        batch["mask"],
        teacher_output=[batch["t_cls"], t_patch],
    )


# ----------------------------------------------------------------------------- formula
@pytest.mark.parametrize("masked_only", [False, True], ids=["every-patch", "masked-only"])
@pytest.mark.parametrize("centering", ["centering", "sinkhorn_knopp"])
def test_loss_matches_dinov2s_formula(centering: str, masked_only: bool) -> None:
    loss = make_loss(centering=centering, koleo_loss_weight=0.3, ibot_loss_weight=0.7)
    torch.manual_seed(0)
    loss.center.copy_(torch.randn(1, K) * 0.3)
    loss.patch_center.copy_(torch.randn(1, K) * 0.3)
    batch = make_batch(3, seed=1)
    expected = ref_dinov2(batch, centering, loss.center, loss.patch_center, (1.0, 0.3, 0.7))
    got = run(loss, batch, masked_only)
    for key, value in expected.items():
        assert got[key].item() == pytest.approx(value, rel=1e-5), key


def test_sinkhorn_targets_are_balanced_assignments() -> None:
    loss = make_loss(centering="sinkhorn_knopp", sinkhorn_knopp_iterations=50)
    t = torch.randn(12, K) * 0.05  # logits of a normalised head: |t| <~ 1
    cls_targets, _ = loss.teacher_targets(t, torch.randn(3, K), torch.tensor(3))
    torch.testing.assert_close(cls_targets.sum(dim=1), torch.ones(12))
    # after many iterations every prototype gets B / K of the mass
    torch.testing.assert_close(cls_targets.sum(dim=0), torch.full((K,), 12 / K), atol=1e-4, rtol=0)


def test_gradients_and_koleo_off() -> None:
    loss = make_loss(koleo_loss_weight=0.0)
    batch = make_batch(2, seed=2)
    batch["tokens"] = None  # no class token needed without KoLeo
    for key in ("s_cls", "s_patch", "s_local"):
        batch[key].requires_grad_(True)
    out = loss(
        [[batch["s_cls"], batch["s_patch"]], [batch["s_local"]]],
        batch["mask"],
        teacher_output=[batch["t_cls"], batch["t_patch"]],
    )
    assert out["koleo_loss"].item() == 0.0
    out["loss"].backward()
    flat = batch["mask"].reshape(batch["mask"].shape[0], -1)
    grad = batch["s_patch"].grad.abs().sum(dim=-1)
    assert torch.all(grad[~flat] == 0) and torch.all(grad[flat] > 0)
    assert batch["s_cls"].grad.abs().sum() > 0 and batch["s_local"].grad.abs().sum() > 0


def test_koleo_pushes_the_nearest_neighbours_apart() -> None:
    loss = make_loss(dino_loss_weight=0.0, ibot_loss_weight=0.0, koleo_loss_weight=1.0)
    batch = make_batch(4, seed=3)
    batch["tokens"].requires_grad_(True)
    out = run(loss, batch)
    out["loss"].backward()
    step = batch["tokens"].detach() - 0.05 * batch["tokens"].grad
    after = run(make_loss(dino_loss_weight=0.0, ibot_loss_weight=0.0, koleo_loss_weight=1.0),
                {**batch, "tokens": step})  # fmt: skip
    assert after["koleo_loss"] < out["koleo_loss"]


def test_centers_follow_the_global_masked_rows_in_centering_mode_only() -> None:
    loss = make_loss(center_momentum=0.8)
    batch = make_batch(3, seed=4)
    run(loss, batch)
    flat = batch["mask"].reshape(batch["mask"].shape[0], -1)
    torch.testing.assert_close(
        loss.center, 0.2 * batch["t_cls"].mean(dim=0, keepdim=True), rtol=0, atol=1e-6
    )
    torch.testing.assert_close(  # the masked patches only (DINOv2), not every patch (iBOT)
        loss.patch_center, 0.2 * batch["t_patch"][flat].mean(dim=0, keepdim=True), rtol=0, atol=1e-6
    )
    sk = make_loss(centering="sinkhorn_knopp")
    run(sk, batch)
    assert not sk.center.any() and not sk.patch_center.any()


# ----------------------------------------------------------------------------- 2 ranks
def _rank_worker(rank: int, world: int, centering: str) -> dict[str, Any]:
    loss = make_loss(centering=centering)
    batch = make_batch(2 + rank, seed=30 + rank)  # unequal batches and masked counts
    flat = batch["mask"].reshape(batch["mask"].shape[0], -1)
    t_rows = batch["t_patch"][flat]
    cls_t, rows_t = loss.teacher_targets(batch["t_cls"], t_rows, flat.sum())
    out = run(loss, batch)
    return {
        "cls_targets": cls_t.tolist(),
        "row_targets": rows_t.tolist(),
        "koleo": out["koleo_loss"].item(),
        "center": loss.center.reshape(-1).tolist(),
        "patch_center": loss.patch_center.reshape(-1).tolist(),
    }


@pytest.mark.parametrize("centering", ["centering", "sinkhorn_knopp"])
def test_two_ranks_against_one_process_on_the_global_batch(centering: str) -> None:
    """Sinkhorn-Knopp and the centers span the ranks (each rank's targets are the rows of
    the global computation); KoLeo does not (each rank's is its own batch's, as DINOv2's)."""
    results = spawn_gloo(_rank_worker, 2, centering)
    batches = [make_batch(2 + r, seed=30 + r) for r in range(2)]
    flats = [b["mask"].reshape(b["mask"].shape[0], -1) for b in batches]
    t_cls = torch.cat([b["t_cls"] for b in batches])
    t_rows = torch.cat([b["t_patch"][f] for b, f in zip(batches, flats)])
    single = make_loss(centering=centering)
    cls_t, rows_t = single.teacher_targets(t_cls, t_rows, torch.tensor(t_rows.shape[0]))
    got_cls = torch.tensor([row for r in results for row in r["cls_targets"]])
    got_rows = torch.tensor([row for r in results for row in r["row_targets"]])
    torch.testing.assert_close(got_cls, cls_t, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_rows, rows_t, rtol=1e-5, atol=1e-6)
    if centering == "centering":
        for r in results:
            assert r["center"] == pytest.approx((0.1 * t_cls.mean(dim=0)).tolist(), abs=1e-6)
            assert r["patch_center"] == pytest.approx((0.1 * t_rows.mean(dim=0)).tolist(), abs=1e-6)
    for r, batch in zip(results, batches):
        b = batch["tokens"].shape[0] // G
        per_rank = sum(ref_koleo(batch["tokens"][q * b : (q + 1) * b].tolist()) for q in range(G))
        assert r["koleo"] == pytest.approx(per_rank, rel=1e-5)
    tokens = torch.cat([b["tokens"] for b in batches])
    global_koleo = ref_koleo(tokens[::2].tolist())
    assert results[0]["koleo"] != pytest.approx(global_koleo, rel=1e-3)


# ----------------------------------------------------------------------------- schedules
def test_teacher_temperature_and_momentum_schedules() -> None:
    assert [linear_warmup(i, 0.04, 0.07, 3) for i in range(5)] == pytest.approx(
        [0.04, 0.05, 0.06, 0.07, 0.07]
    )
    loss = make_loss(warmup_teacher_temp=0.04, teacher_temp=0.07, warmup_teacher_temp_iters=3)
    loss.set_schedule_position(1, 7)
    assert loss.teacher_temp == pytest.approx(0.05)
    loss = make_loss(momentum_teacher=0.992, final_momentum_teacher=0.998)
    assert loss.teacher_momentum_at(0, 10) == pytest.approx(0.992)
    assert loss.teacher_momentum_at(5, 10) == pytest.approx(0.995)
    assert loss.teacher_momentum_at(10, 10) == pytest.approx(0.998)


# ----------------------------------------------------------------------------- config
@pytest.fixture(scope="module")
def quick_cfg() -> AttrDict:
    _, cfg = hydra_compose_and_validate(["config=test/integration_test/quick_dinov2"])
    return cfg


def test_build_from_the_quick_config(quick_cfg) -> None:
    loss = build_loss(quick_cfg.LOSS, quick_cfg)
    assert isinstance(loss, DINOv2Loss)
    assert (loss.num_global_crops, loss.num_local_crops, loss.out_dim) == (2, 2, 64)
    assert loss.patch_out_dim == 64 and loss.centering == "centering"


def test_koleo_needs_the_heads_class_token(quick_cfg) -> None:
    cfg = AttrDict(quick_cfg.to_dict())
    cfg.MODEL.HEAD.PARAMS[0][1]["output_cls_token"] = False
    with pytest.raises(ConfigError, match="output_cls_token"):
        build_loss(cfg.LOSS, cfg)
    cfg.LOSS.dinov2_loss.koleo_loss_weight = 0.0
    assert build_loss(cfg.LOSS, cfg).koleo_loss_weight == 0.0


@pytest.mark.parametrize(
    "key,value",
    [("centering", "softmax"), ("sinkhorn_knopp_iterations", 0), ("teacher_temp", -1),
     ("momentum_teacher", 2.0), ("koleo_loss_weight", -0.1)],
)  # fmt: skip
def test_bad_values_name_their_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"{KEY}.{key}"):
        make_loss(**{key: value})

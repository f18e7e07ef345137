"""colorization_loss against Zhang et al. 2016's eq. 2-4 written out here with loops: soft
encoding on the 5 nearest bins (sigma 5), the prior counted from the targets, smoothed,
mixed with the uniform (lambda 0.5), weights with E[w] = 1; the gradient; the prior's
counts across 2 gloo processes equal one process's; config errors with key paths;
colorization_head."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import vissl
from vissl.config.attr_dict import AttrDict
from vissl.errors import ConfigError
from vissl.losses import build_loss
from vissl.losses.colorization_loss import (
    ColorizationLoss,
    ColorizationParams,
    rebalancing_weights,
    soft_encode_ab,
)
from vissl.models import build_model
from vissl.utils.lab_color import in_gamut_ab_bins
from vissl.utils.test_utils import spawn_gloo

KEY = "config.LOSS.colorization_loss"
_DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"
_MODEL_DEFAULTS: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.MODEL)  # type: ignore[assignment]


def centers() -> list[tuple[float, float]]:
    return [tuple(c) for c in in_gamut_ab_bins(10)[0].tolist()]


# ----------------------------------------------------------------------- the paper, by hand
def ref_soft_encode(
    a: float, b: float, cs: list[tuple[float, float]], k: int = 5, sigma: float = 5.0
):
    """{bin: weight}: the k nearest centres, Gaussian of the distance, summing to 1."""
    d2 = sorted(((a - ca) ** 2 + (b - cb) ** 2, q) for q, (ca, cb) in enumerate(cs))[:k]
    g = {q: math.exp(-d / (2 * sigma**2)) for d, q in d2}
    total = sum(g.values())
    return {q: v / total for q, v in g.items()}


def ref_weights(counts: dict[int, float], cs, lam: float = 0.5, sigma: float = 5.0) -> list[float]:
    """Eq. 4: p from counts, smoothed by a Gaussian over the centres, w = 1/((1-l) p~ + l/Q),
    normalised so that sum_q p~_q w_q = 1."""
    q_all = len(cs)
    total = sum(counts.values())
    p = {q: c / total for q, c in counts.items()}
    smooth = []
    for ca, cb in cs:
        smooth.append(
            sum(
                pj * math.exp(-((ca - cs[j][0]) ** 2 + (cb - cs[j][1]) ** 2) / (2 * sigma**2))
                for j, pj in p.items()
            )
        )
    z = sum(smooth)
    smooth = [s / z for s in smooth]
    w = [1.0 / ((1 - lam) * s + lam / q_all) for s in smooth]
    norm = sum(s * wi for s, wi in zip(smooth, w))
    return [wi / norm for wi in w]


def ref_loss(logits: torch.Tensor, ab: torch.Tensor, counts: dict[int, float]) -> float:
    """Eq. 2 averaged over pixels, with the ab target averaged over 2x2 blocks (the output
    map is half the target's size here)."""
    cs = centers()
    w = ref_weights(counts, cs)
    n, _, h, wd = logits.shape
    total = 0.0
    for i in range(n):
        for y in range(h):
            for x in range(wd):
                block = ab[i, :, 2 * y : 2 * y + 2, 2 * x : 2 * x + 2].double()
                a, b = float(block[0].mean()), float(block[1].mean())
                z = ref_soft_encode(a, b, cs)
                col = logits[i, :, y, x].double()
                log_z = float(torch.logsumexp(col, 0))
                ce = -sum(zq * (float(col[q]) - log_z) for q, zq in z.items())
                nearest = max(z, key=z.get)
                total += w[nearest] * ce
    return total / (n * h * wd)


def ref_counts(ab: torch.Tensor, out_hw: tuple[int, int]) -> dict[int, float]:
    cs = centers()
    counts: dict[int, float] = {}
    n = ab.shape[0]
    for i in range(n):
        for y in range(out_hw[0]):
            for x in range(out_hw[1]):
                block = ab[i, :, 2 * y : 2 * y + 2, 2 * x : 2 * x + 2].double()
                a, b = float(block[0].mean()), float(block[1].mean())
                q = min(range(len(cs)), key=lambda j: (a - cs[j][0]) ** 2 + (b - cs[j][1]) ** 2)
                counts[q] = counts.get(q, 0) + 1
    return counts


def batch(seed: int, n: int = 2, h: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = len(centers())
    logits = torch.randn(n, q, h, h, generator=g) * 2
    ab = torch.rand(n, 2, 2 * h, 2 * h, generator=g) * 120 - 60  # a, b in [-60, 60]
    return logits, ab


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------- tests
def test_loss_equals_eq_2_to_4_and_counts_the_batch_first() -> None:
    loss_fn = ColorizationLoss()
    logits, ab = batch(0)
    loss = loss_fn(logits.requires_grad_(), [ab])
    counts = ref_counts(ab, (3, 3))
    assert float(loss.detach()) == pytest.approx(ref_loss(logits.detach(), ab, counts), rel=1e-5)
    assert {q: c for q, c in enumerate(loss_fn.counts.tolist()) if c} == counts
    # a second training batch: the weights come from both batches' counts
    logits2, ab2 = batch(1)
    loss2 = loss_fn(logits2.requires_grad_(), ab2)
    both = dict(counts)
    for q, c in ref_counts(ab2, (3, 3)).items():
        both[q] = both.get(q, 0) + c
    assert float(loss2.detach()) == pytest.approx(ref_loss(logits2.detach(), ab2, both), rel=1e-5)
    # no gradient (a test phase): the prior does not move
    before = loss_fn.counts.clone()
    with torch.no_grad():
        loss_fn(logits2, ab2)
    assert torch.equal(loss_fn.counts, before)


def test_gradient_is_the_weighted_softmax_minus_the_soft_target() -> None:
    loss_fn = ColorizationLoss()
    logits, ab = batch(2)
    logits.requires_grad_()
    loss_fn(logits, ab).backward()
    with torch.no_grad():
        small = torch.nn.functional.avg_pool2d(ab, 2)
        z = soft_encode_ab(small, loss_fn.centers)
        w, _ = loss_fn.weights()
        v = w.float()[z.argmax(1)]
        expected = v.unsqueeze(1) * (logits.softmax(1) - z) / (2 * 3 * 3)
    torch.testing.assert_close(logits.grad, expected, rtol=1e-4, atol=1e-7)


def test_soft_encoding_of_a_bin_centre() -> None:
    cs = in_gamut_ab_bins(10)[0]
    ab = torch.tensor([20.0, -30.0]).view(1, 2, 1, 1)  # a centre whose 4 neighbours exist
    z = soft_encode_ab(ab, cs)[0, :, 0, 0]
    assert int((z > 0).sum()) == 5 and float(z.sum()) == pytest.approx(1.0)
    e = math.exp(-100 / 50)  # the 4 neighbours at distance 10, sigma 5
    index = {tuple(c): i for i, c in enumerate(cs.tolist())}
    assert float(z[index[(20.0, -30.0)]]) == pytest.approx(1 / (1 + 4 * e))
    for nb in [(10.0, -30.0), (30.0, -30.0), (20.0, -40.0), (20.0, -20.0)]:
        assert float(z[index[nb]]) == pytest.approx(e / (1 + 4 * e))
    # any point: 5 bins, the nearest has the largest weight, sums to 1
    pts = torch.rand(1, 2, 4, 4, generator=torch.Generator().manual_seed(3)) * 100 - 50
    zz = soft_encode_ab(pts, cs)
    assert torch.equal((zz > 0).sum(1), torch.full((1, 4, 4), 5))
    torch.testing.assert_close(zz.sum(1), torch.ones(1, 4, 4))
    nearest = torch.cdist(pts.permute(0, 2, 3, 1).reshape(-1, 2), cs).argmin(1)
    assert torch.equal(zz.argmax(1).flatten(), nearest)


def test_rebalancing_weights_properties() -> None:
    cs = in_gamut_ab_bins(10)[0]
    from vissl.losses.colorization_loss import gaussian_kernel

    kernel = gaussian_kernel(cs, 5.0)
    prior = (
        torch.rand(cs.shape[0], generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        ** 4
    )
    w, smooth = rebalancing_weights(prior, kernel, 0.5)
    assert float((smooth * w).sum()) == pytest.approx(1.0)  # E_p~[w] = 1
    assert float(smooth.sum()) == pytest.approx(1.0)
    order = smooth.argsort()
    assert bool((w[order][1:] <= w[order][:-1] + 1e-12).all())  # rarer colours weigh more
    ones, _ = rebalancing_weights(prior, kernel, 1.0)  # lambda 1: uniform, all weights 1
    torch.testing.assert_close(ones, torch.ones_like(ones))
    inv, sm = rebalancing_weights(prior, kernel, 0.0)  # lambda 0: w = 1 / p~ / Q
    torch.testing.assert_close(inv, 1.0 / (sm * cs.shape[0]))
    # eq. 4 written out for a sparse prior
    counts = {3: 5.0, 100: 1.0, 200: 2.0}
    sparse = torch.zeros(cs.shape[0], dtype=torch.float64)
    for q, c in counts.items():
        sparse[q] = c
    got, _ = rebalancing_weights(sparse, kernel, 0.5)
    assert got.tolist() == pytest.approx(
        ref_weights(counts, [tuple(c) for c in cs.tolist()]), rel=1e-9
    )
    uniform, _ = rebalancing_weights(torch.zeros_like(prior), kernel, 0.5)  # nothing counted yet
    assert bool(torch.isfinite(uniform).all())


def test_fixed_prior_file_and_own_bin_centres(tmp_path: Path) -> None:
    q = len(centers())
    prior = np.random.RandomState(5).rand(q)
    np.save(tmp_path / "prior.npy", prior)
    loss_fn = ColorizationLoss(prior_file=str(tmp_path / "prior.npy"))
    logits, ab = batch(6)
    loss_fn(logits.requires_grad_(), ab)
    assert float(loss_fn.counts.sum()) == 0  # nothing counted: the prior is fixed
    w, _ = loss_fn.weights()
    expected, _ = rebalancing_weights(torch.from_numpy(prior), loss_fn.kernel, 0.5)
    torch.testing.assert_close(w, expected)
    grid = np.array(
        [[a, b] for a in range(-20, 21, 10) for b in range(-20, 21, 10)], dtype=np.float32
    )
    np.save(tmp_path / "bins.npy", grid)
    small = ColorizationLoss(bin_centers_file=str(tmp_path / "bins.npy"))
    assert small.num_bins == 25
    out = small(torch.randn(1, 25, 2, 2, requires_grad=True), torch.zeros(1, 2, 4, 4))
    assert math.isfinite(float(out.detach()))
    with pytest.raises(ConfigError) as err:
        ColorizationLoss(prior_file=str(tmp_path / "bins.npy"))
    assert err.value.key_path == f"{KEY}.prior_file"


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        build_loss({"name": "colorization_loss", "colorization_loss": {"prior_mxi": 0.5}})
    assert err.value.key_path == f"{KEY}.prior_mxi"
    for key, value in [
        ("prior_mix", 1.5),
        ("num_neighbors", 0),
        ("grid_size", 0),
        ("soft_encoding_sigma", 0),
    ]:
        with pytest.raises(ConfigError) as err:
            build_loss({"name": "colorization_loss", "colorization_loss": {key: value}})
        assert err.value.key_path == f"{KEY}.{key}"
    with pytest.raises(ConfigError) as err:
        ColorizationLoss(prior_file="/no/such/prior.npy")
    assert err.value.key_path == f"{KEY}.prior_file"
    loss_fn = ColorizationLoss()
    with pytest.raises(ConfigError) as err:  # a head of the wrong width
        loss_fn(torch.randn(1, 313, 2, 2), torch.zeros(1, 2, 4, 4))
    assert err.value.key_path == "config.MODEL.HEAD.PARAMS" and "262" in str(err.value)
    with pytest.raises(ValueError, match="colorization_collator"):
        loss_fn(torch.randn(1, 262, 2, 2), torch.zeros(1, 4, 4))


def test_defaults_match_defaults_yaml() -> None:
    yaml = OmegaConf.to_container(OmegaConf.load(_DEFAULTS).config.LOSS.colorization_loss)
    from vissl.config.params import as_dict

    assert yaml == as_dict(ColorizationParams())


def test_counts_are_checkpointed() -> None:
    loss_fn = ColorizationLoss()
    logits, ab = batch(7)
    loss_fn(logits.requires_grad_(), ab)
    state = loss_fn.state_dict()
    assert set(state) == {"counts"}
    fresh = ColorizationLoss()
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.weights()[0], loss_fn.weights()[0])


# ----------------------------------------------------------------------- 2 processes vs 1
def _rank_worker(rank: int, world: int) -> dict[str, Any]:
    logits, ab = batch(8, n=4)
    rows = slice(rank * 2, rank * 2 + 2)
    loss_fn = ColorizationLoss()
    loss = loss_fn(logits[rows].clone().requires_grad_(), ab[rows])
    return {"loss": float(loss.detach()), "counts": loss_fn.counts.clone()}


def test_two_processes_count_the_global_batch() -> None:
    results = spawn_gloo(_rank_worker, 2)
    logits, ab = batch(8, n=4)
    single = ColorizationLoss()
    full = single(logits.requires_grad_(), ab)
    for r in results:  # every rank holds the counts of the whole batch
        torch.testing.assert_close(r["counts"], single.counts)
    # equal pixels per rank: the mean of the ranks' losses is the one-process loss
    assert (results[0]["loss"] + results[1]["loss"]) / 2 == pytest.approx(
        float(full.detach()), rel=1e-5
    )


# ----------------------------------------------------------------------- head
def _model_config(**alexnet: Any) -> AttrDict:
    cfg = AttrDict(copy.deepcopy(_MODEL_DEFAULTS))
    cfg.TRUNK.NAME = "alexnet_colorization"
    cfg.INPUT_TYPE = "lab"
    cfg.TRUNK.ALEXNET.update(alexnet)
    cfg.HEAD.PARAMS = [["colorization_head", {"dims": [256, 64, 262]}]]
    return cfg


def test_colorization_head_on_conv5_predicts_every_bin_per_pixel() -> None:
    model = build_model(_model_config(DEFAULT_OUTPUT="conv5"), AttrDict())
    (out,) = model(torch.randn(2, 3, 99, 99))
    assert out.shape == (2, 262, 5, 5)  # conv5 of a 99 px input
    loss = ColorizationLoss()(out, torch.randn(2, 2, 99, 99) * 30)
    loss.backward()
    assert model.trunk._feature_blocks[0][0].weight.grad is not None
    flat = build_model(_model_config(), AttrDict())  # the default output: flatten
    with pytest.raises(ConfigError) as err:  # refused at the first forward, with the fix
        flat(torch.randn(2, 3, 99, 99))
    assert "DEFAULT_OUTPUT" in str(err.value) and err.value.key_path == "config.MODEL.HEAD.PARAMS"

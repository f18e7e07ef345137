"""``cutmixup_collator`` against an independent computation of mixup / CutMix.

The reference below redraws the random numbers from a ``RandomState`` with the batch's
seed, in VISSL's order (per batch: apply?, cutmix?, lam, then the box; per row or pair:
cutmix flags, both Beta samples, apply flags, then each row's box), and builds every mixed
pixel and every soft-target entry one by one from the papers' formulas:
``x = lam x_i + (1 - lam) x_j`` (mixup), ``x_j`` inside the box and ``x_i`` outside
(CutMix, ``lam`` the uncovered share), ``t = lam y_i + (1 - lam) y_j`` with ``y`` the
smoothed one-hot label and ``j = B - 1 - i``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tests.data.conftest import make_cfg
from vissl.data import build_collate_fn, build_dataset
from vissl.data.collators.cutmixup_collator import cutmixup_collator
from vissl.data.samplers import SampleKey, SeededSamples, batch_seed
from vissl.errors import ConfigError

K = 5  # classes


def _batch(
    size: int = 6, views: int = 1, seed: int | None = 7, hw: tuple[int, int] = (8, 10)
) -> Any:
    gen = torch.Generator().manual_seed(100 + size + views)
    samples = [
        {
            "data": [torch.rand(3, *hw, generator=gen) for _ in range(views)],
            "label": [(3 * i + v) % K for v in range(views)],
            "data_valid": [1] * views,
            "data_idx": [10 + i] * views,
        }
        for i in range(size)
    ]
    return samples if seed is None else SeededSamples(samples, seed)


def _box(rng: np.random.RandomState, h: int, w: int, lam: float, p: dict[str, Any]):
    """The reference box and lam (clipped centre box, or min/max box)."""
    minmax = p.get("cutmix_minmax")
    if minmax is not None:
        ch = rng.randint(int(h * minmax[0]), int(h * minmax[1]))
        cw = rng.randint(int(w * minmax[0]), int(w * minmax[1]))
        top, left = rng.randint(0, h - ch), rng.randint(0, w - cw)
        box = (top, top + ch, left, left + cw)
    else:
        cut = math.sqrt(1 - lam)
        ch, cw = int(h * cut), int(w * cut)
        cy, cx = rng.randint(0, h), rng.randint(0, w)
        box = (
            int(np.clip(cy - ch // 2, 0, h)),
            int(np.clip(cy + ch // 2, 0, h)),
            int(np.clip(cx - cw // 2, 0, w)),
            int(np.clip(cx + cw // 2, 0, w)),
        )
    if p.get("correct_lam", True) or minmax is not None:
        lam = 1 - (box[1] - box[0]) * (box[3] - box[2]) / (h * w)
    return box, lam


def _reference(x: np.ndarray, labels: list[int], p: dict[str, Any], rng: np.random.RandomState):
    """Mixed images and soft targets, pixel by pixel and entry by entry."""
    b, _, h, w = x.shape
    mix_a, cut_a = p.get("mixup_alpha", 1.0), p.get("cutmix_alpha", 0.0)
    if p.get("cutmix_minmax") is not None:
        cut_a = 1.0
    prob, switch = p.get("prob", 1.0), p.get("switch_prob", 0.5)
    mode = p.get("mode", "batch")
    # per row: (lam, box or None, partner)
    plan: list[tuple[float, Any]] = [(1.0, None)] * b
    if mode == "batch":
        if rng.rand() < prob:
            if mix_a > 0 and cut_a > 0:
                cutmix = rng.rand() < switch
                lam = rng.beta(cut_a, cut_a) if cutmix else rng.beta(mix_a, mix_a)
            elif mix_a > 0:
                cutmix, lam = False, rng.beta(mix_a, mix_a)
            else:
                cutmix, lam = True, rng.beta(cut_a, cut_a)
            box = None
            if cutmix:
                box, lam = _box(rng, h, w, lam, p)
            plan = [(lam, box)] * b
    else:
        n = b if mode == "elem" else b // 2
        if mix_a > 0 and cut_a > 0:
            cutmix = rng.rand(n) < switch
            lam_c, lam_m = rng.beta(cut_a, cut_a, n), rng.beta(mix_a, mix_a, n)
            lams = np.where(cutmix, lam_c, lam_m)
        elif mix_a > 0:
            cutmix, lams = np.zeros(n, bool), rng.beta(mix_a, mix_a, n)
        else:
            cutmix, lams = np.ones(n, bool), rng.beta(cut_a, cut_a, n)
        lams = np.where(rng.rand(n) < prob, lams.astype(np.float32), 1.0)
        for i in range(n):
            lam, box = float(lams[i]), None
            if lam != 1.0 and cutmix[i]:
                box, lam = _box(rng, h, w, lam, p)
            plan[i] = (lam, box)
            if mode == "pair":
                plan[b - 1 - i] = (lam, box)
    out = np.empty_like(x)
    for i in range(b):
        j = b - 1 - i
        lam, box = plan[i]
        for c in range(x.shape[1]):
            for yy in range(h):
                for xx in range(w):
                    if lam == 1.0:
                        out[i, c, yy, xx] = x[i, c, yy, xx]
                    elif box is not None:
                        inside = box[0] <= yy < box[1] and box[2] <= xx < box[3]
                        out[i, c, yy, xx] = x[j, c, yy, xx] if inside else x[i, c, yy, xx]
                    else:
                        out[i, c, yy, xx] = lam * x[i, c, yy, xx] + (1 - lam) * x[j, c, yy, xx]
    s = p.get("label_smoothing", 0.1)
    target = np.zeros((b, K))
    for i in range(b):
        j = b - 1 - i
        lam = plan[i][0]
        for k in range(K):
            yi = 1 - s + s / K if k == labels[i] else s / K
            yj = 1 - s + s / K if k == labels[j] else s / K
            target[i, k] = lam * yi + (1 - lam) * yj
    return out, target


CASES = {
    "batch_mixup": {"mixup_alpha": 0.8},
    "batch_cutmix": {"mixup_alpha": 0.0, "cutmix_alpha": 1.0},
    "batch_cutmix_uncorrected": {"mixup_alpha": 0, "cutmix_alpha": 1.0, "correct_lam": False},
    "batch_both": {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "switch_prob": 0.5},
    "batch_minmax": {"mixup_alpha": 0.0, "cutmix_minmax": [0.3, 0.8]},
    "elem_both": {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "mode": "elem", "prob": 0.7},
    "pair_both": {"mixup_alpha": 0.4, "cutmix_alpha": 1.0, "mode": "pair", "switch_prob": 0.6},
    "elem_mixup_no_smoothing": {"mode": "elem", "label_smoothing": 0.0},
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 3, 11])
def test_matches_the_reference_draw_for_draw(name: str, seed: int) -> None:
    params = {**CASES[name], "num_classes": K}
    batch = _batch(size=6, views=2, seed=seed)
    out = cutmixup_collator(batch, **params)
    rng = np.random.RandomState(seed)
    assert len(out["data"]) == 1 and len(out["data"][0]) == 2
    targets = out["label"][0]
    assert targets.shape == (12, K)
    for view in range(2):  # the views are mixed one after the other from the same draws
        x = np.stack([s["data"][view].numpy() for s in batch]).astype(np.float64)
        labels = [s["label"][view] for s in batch]
        want_x, want_t = _reference(x, labels, params, rng)
        got = out["data"][0][view].numpy()
        np.testing.assert_allclose(got, want_x, rtol=0, atol=1e-6)
        np.testing.assert_allclose(targets[6 * view : 6 * view + 6].numpy(), want_t, atol=1e-6)
    np.testing.assert_allclose(targets.sum(1).numpy(), 1.0, atol=1e-6)
    assert out["data_idx"][0].tolist() == [10, 11, 12, 13, 14, 15] * 2
    assert out["data_valid"][0].tolist() == [1] * 12


def test_cases_do_mix() -> None:
    """The cases above are not trivially unmixed: each changes images and spreads targets."""
    for params in CASES.values():
        batch = _batch(size=6)
        out = cutmixup_collator(batch, **params, num_classes=K)
        original = torch.stack([s["data"][0] for s in batch])
        assert not torch.equal(out["data"][0][0], original)
        assert (out["label"][0].max(1).values < 1 - 0.1 + 0.1 / K - 1e-3).any()


def test_prob_zero_keeps_the_images_and_smooths_the_labels() -> None:
    batch = _batch(size=4)
    out = cutmixup_collator(batch, mixup_alpha=1.0, cutmix_alpha=1.0, prob=0.0, num_classes=K)
    assert torch.equal(out["data"][0][0], torch.stack([s["data"][0] for s in batch]))
    want = torch.full((4, K), 0.1 / K)
    want[torch.arange(4), torch.tensor([s["label"][0] for s in batch])] = 0.9 + 0.1 / K
    assert torch.allclose(out["label"][0], want)


def test_the_draws_come_from_the_batch_seed_only() -> None:
    a = cutmixup_collator(_batch(seed=5), mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=K)
    torch.manual_seed(123)
    np.random.seed(123)
    b = cutmixup_collator(_batch(seed=5), mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=K)
    c = cutmixup_collator(_batch(seed=6), mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=K)
    assert torch.equal(a["label"][0], b["label"][0])
    assert torch.equal(a["data"][0][0], b["data"][0][0])
    assert not torch.equal(a["label"][0], c["label"][0])
    # without a seed (a hand-made list) the samples' indices seed it: still deterministic
    d = cutmixup_collator(_batch(seed=None), mixup_alpha=0.8, num_classes=K)
    e = cutmixup_collator(_batch(seed=None), mixup_alpha=0.8, num_classes=K)
    assert torch.equal(d["data"][0][0], e["data"][0][0])


def test_dataset_gives_each_batch_a_seed_of_seed_epoch_and_indices() -> None:
    cfg = make_cfg(
        {
            "DATA_SOURCES": ["synthetic"],
            "DATA_LIMIT": 8,
            "TRANSFORMS": [{"name": "ToTensor"}],
        }
    )
    dataset = build_dataset(cfg, "TRAIN")
    keys = [SampleKey(3, 1), SampleKey(5, 1)]
    samples = dataset.__getitems__(keys)
    assert isinstance(samples, SeededSamples)
    assert samples.seed == batch_seed(dataset.seed, keys)
    other_epoch = dataset.__getitems__([SampleKey(3, 2), SampleKey(5, 2)])
    other_order = dataset.__getitems__([SampleKey(5, 1), SampleKey(3, 1)])
    assert len({samples.seed, other_epoch.seed, other_order.seed}) == 3
    assert type(dataset.__getitems__([3, 5])) is list  # bare indices: no epoch, no seed


def test_simclr_and_moco_layouts() -> None:
    batch = _batch(size=4, views=2)
    plain = cutmixup_collator(batch, mixup_alpha=0.8, num_classes=K)
    simclr = cutmixup_collator(batch, mixup_alpha=0.8, num_classes=K, ssl_method="simclr")
    assert torch.equal(simclr["data"][0], torch.cat(plain["data"][0]))
    assert torch.equal(simclr["label"][0], plain["label"][0])
    moco = cutmixup_collator(batch, mixup_alpha=0.8, num_classes=K, ssl_method="moco")
    assert torch.equal(moco["data"][0], plain["data"][0][0])
    assert torch.equal(moco["data_momentum"][0], plain["data"][0][1])
    assert torch.equal(moco["label"][0], plain["label"][0][:4])


KEY = "config.DATA.<split>.COLLATE_FUNCTION_PARAMS"
BAD = [
    ({"mixup_alpha": 0.0, "cutmix_alpha": 0.0}, f"{KEY}.mixup_alpha"),
    ({"mixup_alpha": -1.0}, f"{KEY}.mixup_alpha"),
    ({"cutmix_alpha": "1"}, f"{KEY}.cutmix_alpha"),
    ({"cutmix_minmax": [0.8, 0.2]}, f"{KEY}.cutmix_minmax"),
    ({"cutmix_minmax": [0.2]}, f"{KEY}.cutmix_minmax"),
    ({"prob": 1.5}, f"{KEY}.prob"),
    ({"switch_prob": -0.1}, f"{KEY}.switch_prob"),
    ({"mode": "row"}, f"{KEY}.mode"),
    ({"correct_lam": 1}, f"{KEY}.correct_lam"),
    ({"label_smoothing": 2.0}, f"{KEY}.label_smoothing"),
    ({"num_classes": 0}, f"{KEY}.num_classes"),
    ({"ssl_method": "byol"}, f"{KEY}.ssl_method"),
]


@pytest.mark.parametrize(("params", "key"), BAD)
def test_bad_parameters_name_their_key(params: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        cutmixup_collator(_batch(size=4), **{"num_classes": K, **params})
    assert err.value.key_path == key
    assert key in str(err.value)


def test_bad_batches_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="num_classes") as err:
        cutmixup_collator(_batch(size=4), num_classes=3)  # labels up to 4
    assert err.value.key_path == f"{KEY}.num_classes"
    with pytest.raises(ConfigError, match="even") as err:
        cutmixup_collator(_batch(size=5), mode="pair", num_classes=K)
    assert err.value.key_path == f"{KEY}.mode"
    pil = [dict(s, data=[Image.new("RGB", (8, 8))]) for s in _batch(size=4)]
    with pytest.raises(ConfigError, match="ToTensor"):
        cutmixup_collator(pil, num_classes=K)
    ints = [dict(s, data=[(s["data"][0] * 255).to(torch.uint8)]) for s in _batch(size=4)]
    with pytest.raises(ConfigError, match="float images"):
        cutmixup_collator(ints, num_classes=K)
    with pytest.raises(ConfigError, match="cutmix_minmax"):  # no whole-pixel box size on 2x2
        cutmixup_collator(
            _batch(size=4, hw=(2, 2)), mixup_alpha=0.0, cutmix_minmax=[0.3, 0.4], num_classes=K
        )


def test_values_are_checked_when_the_loader_is_built() -> None:
    cfg = make_cfg(
        {
            "COLLATE_FUNCTION": "cutmixup_collator",
            "COLLATE_FUNCTION_PARAMS": {"mixup_alpha": 0.8, "mode": "rows"},
        }
    )
    with pytest.raises(ConfigError) as err:
        build_collate_fn(cfg, "TRAIN")
    assert err.value.key_path == "config.DATA.TRAIN.COLLATE_FUNCTION_PARAMS.mode"


def test_batches_do_not_depend_on_the_data_loader_workers() -> None:
    """The same (seed, epoch) gives the same mixed batches in the main process and in
    workers: the mixing draws from the batch's seed, not from a process's generators."""
    from vissl.data import get_loader

    def batches(num_workers: int) -> list[dict[str, Any]]:
        cfg = make_cfg(
            {
                "DATA_SOURCES": ["synthetic"],
                "DATA_LIMIT": 16,
                "BATCHSIZE_PER_REPLICA": 4,
                "TRANSFORMS": [{"name": "RandAugment", "magnitude": 9}, {"name": "ToTensor"}],
                "COLLATE_FUNCTION": "cutmixup_collator",
                "COLLATE_FUNCTION_PARAMS": {
                    "mixup_alpha": 0.8,
                    "cutmix_alpha": 1.0,
                    "num_classes": 10,
                },
            },
            MULTI_PROCESSING_METHOD="fork",
        )
        cfg.DATA.NUM_DATALOADER_WORKERS = num_workers
        loader = get_loader(
            build_dataset(cfg, "TRAIN"),
            cfg,
            "TRAIN",
            num_replicas=1,
            rank=0,
            seed=0,
            device_is_cuda=False,
        )
        loader.sampler.set_epoch(1)
        return list(loader)

    main, in_workers = batches(0), batches(2)
    assert len(main) == len(in_workers) == 4
    for a, b in zip(main, in_workers, strict=True):
        assert torch.equal(a["data"][0][0], b["data"][0][0])
        assert torch.equal(a["label"][0], b["label"][0])

"""The digits recipes of MSN and DINOv2 give their losses informative targets at step 0.

At its random init the digits ViT gives nearly the same class token for every digit. A
recipe whose head passes that on unchanged has collapsed targets before it trains: MSN
without BatchNorm and Sinkhorn-Knopp sharpened every digit onto one or two prototypes
(73-100% of the batch on one), and DINOv2's Sinkhorn-Knopp [CLS] targets without
BatchNorm were uniform (entropy 0.96-0.99 ln K), so its DINO term sat at ln K whatever
the student did.

Each test builds the shipped recipe at init as the trainer does (the model from the seed,
the loss binding its EMA teacher / target encoder), takes the first training batch of 128
digits from the recipe's own loader, transforms and collator, and runs the teacher on it
through the loss (``run_teacher``, what IBOTHook calls each step). The targets are then
computed here from the teacher's output, as MSN's ``src/losses.py`` (sharpen, then
``distributed_sinkhorn`` on the sharpened probabilities) and DINOv2's
``sinkhorn_knopp_teacher`` compute them."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from vissl.data import build_dataset, get_loader
from vissl.data.batch import construct_sample_for_model
from vissl.losses import build_loss
from vissl.models import build_model
from vissl.utils.hydra_config import hydra_compose_and_validate


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """One torch thread (this ViT runs fastest on one; the test machine is shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _teacher_at_init(recipe: str) -> tuple[Any, Any, dict[str, Any]]:
    """(config, loss, the loss's teacher output on the recipe's first batch) at init."""
    _, cfg = hydra_compose_and_validate(
        [f"config={recipe}", "config.DATA.NUM_DATALOADER_WORKERS=0"]
    )
    assert cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA == 128
    torch.manual_seed(int(cfg.SEED_VALUE))
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss = build_loss(cfg.LOSS, cfg)
    loss.bind_model(model)
    model.train()
    loss.train()
    dataset = build_dataset(cfg, "TRAIN")
    loader = get_loader(
        dataset,
        cfg,
        "TRAIN",
        num_replicas=1,
        rank=0,
        seed=int(cfg.SEED_VALUE),
        device_is_cuda=False,
    )
    loader.sampler.set_epoch(0)  # type: ignore[attr-defined]
    batch = next(iter(loader))
    keys = SimpleNamespace(
        data_and_label_keys={
            "input": list(cfg.DATA.TRAIN.INPUT_KEY_NAMES),
            "target": list(cfg.DATA.TRAIN.TARGET_KEY_NAMES),
        }
    )
    sample = construct_sample_for_model(batch, keys)
    loss.set_schedule_position(0, 0)
    with torch.no_grad():
        out = loss.run_teacher(sample["input"])
    return cfg, loss, {"teacher": out, "sample": sample}


def _sinkhorn(q: torch.Tensor, iterations: int) -> torch.Tensor:
    """MSN's / SwAV's Sinkhorn-Knopp on ``q`` (B, K) >= 0: every prototype gets 1/K of the
    mass, every row 1/B, then rows rescaled to sum to 1 (one process)."""
    q = q.t().double()
    q = q / q.sum()
    k, b = q.shape
    for _ in range(iterations):
        q = q / q.sum(dim=1, keepdim=True) / k
        q = q / q.sum(dim=0, keepdim=True) / b
    return (q * b).t()


def test_msn_digits_targets_spread_over_prototypes_at_init() -> None:
    cfg, loss, run = _teacher_at_init("digits/msn")
    (cosines,) = run["teacher"][:1]
    assert cosines.shape == (128, loss.output_dim)
    params = cfg.LOSS.msn_loss
    tau, tau_plus = loss.temperature, loss.target_temperature
    s = loss.label_smoothing
    # MSN: p = snn(target) (smoothed softmax of cosine / tau); sharpen(p, T = tau+ / tau)
    p = (1 - s) * torch.softmax(cosines.double() / tau, dim=1) + s / cosines.shape[1]
    sharp = p ** (tau / tau_plus)
    targets = sharp / sharp.sum(dim=1, keepdim=True)
    if params.use_sinkhorn:
        targets = _sinkhorn(targets, loss.sinkhorn_iterations)
    winners = targets.argmax(dim=1)
    counts = torch.bincount(winners, minlength=targets.shape[1])
    distinct, top_share = int((counts > 0).sum()), float(counts.max()) / len(winners)
    assert distinct >= 10 and top_share <= 0.5, (
        f"digits/msn at init: the sharpened targets of 128 digits use {distinct} prototypes, "
        f"{top_share:.0%} of them on one (collapsed before training)"
    )


def test_dinov2_digits_sinkhorn_cls_targets_are_not_uniform_at_init() -> None:
    cfg, loss, run = _teacher_at_init("digits/dinov2")
    assert cfg.LOSS.dinov2_loss.centering == "sinkhorn_knopp"
    t_cls = run["teacher"][0].double()
    assert t_cls.shape == (2 * 128, 1024)  # the [CLS] rows of both global crops
    # DINOv2's sinkhorn_knopp_teacher: exp(t / tau) (shifted by its max: exact), 3 iterations
    tau = loss.teacher_temp
    q = torch.exp((t_cls - t_cls.max()) / tau)
    targets = _sinkhorn(q, loss.sinkhorn_knopp_iterations)
    entropy = float(-(targets * targets.clamp_min(1e-300).log()).sum(dim=1).mean())
    ln_k = math.log(t_cls.shape[1])
    assert entropy < 0.9 * ln_k, (
        f"digits/dinov2 at init: the Sinkhorn-Knopp [CLS] targets have entropy "
        f"{entropy:.3f} = {entropy / ln_k:.3f} ln K (uniform: the DINO term is ln K)"
    )

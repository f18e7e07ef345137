"""The BYOL ImageNet configs are 300-epoch runs, so they take the 300-epoch preset of
BYOL's code (deepmind-research ``byol/configs/byol.py``), written out here: the learning
rate after batch scaling along the run (``byol/utils/schedules.py``), weight decay, base
target momentum, epochs, warm-up and the LARS settings."""

from __future__ import annotations

import math

import pytest

from tests.config.test_pretrain_method_configs import IMAGENET_TRAIN_IMAGES, _compose, _world_size
from vissl.losses.build import build_loss
from vissl.optimizers.param_scheduler import build_param_schedulers

# byol/configs/byol.py: epochs -> (lr per 256 images, weight decay, base target EMA)
PRESETS = {40: (0.45, 1e-6, 0.97), 100: (0.45, 1e-6, 0.99), 300: (0.3, 1e-6, 0.99)}
PRESETS[1000] = (0.2, 1.5e-6, 0.996)
WARMUP_EPOCHS = 10  # lr_schedule_config.warmup_steps = 10 * images per epoch // batch

CONFIGS = ["pretrain/byol/byol_8gpu_resnet50", "pretrain/byol/byol_64gpu_resnet50"]


def deepmind_lr(step: int, batch: int, base_lr: float, epochs: int) -> float:
    """``schedules.learning_schedule`` with the steps of ``get_config``."""
    total = epochs * IMAGENET_TRAIN_IMAGES // batch
    warmup = WARMUP_EPOCHS * IMAGENET_TRAIN_IMAGES // batch
    peak = base_lr * batch / 256
    if step < warmup:
        return step / warmup * peak
    done = min(step - warmup, total - warmup) / (total - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * done))


@pytest.mark.parametrize("name", CONFIGS)
def test_the_300_epoch_configs_take_byols_300_epoch_preset(name: str) -> None:
    cfg = _compose(name)
    epochs = int(cfg.OPTIMIZER.num_epochs)
    assert epochs == 300
    base_lr, weight_decay, base_ema = PRESETS[epochs]
    batch = int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA) * _world_size(cfg)

    assert float(cfg.OPTIMIZER.weight_decay) == pytest.approx(weight_decay, rel=1e-12)
    loss = build_loss(cfg.LOSS, cfg)
    assert loss.momentum == pytest.approx(base_ema, rel=1e-12)  # cosine to 1 (target_ema)
    opt = cfg.OPTIMIZER
    assert opt.name == "lars" and float(opt.eta) == 1e-3 and float(opt.momentum) == 0.9
    assert opt.exclude_bias_and_norm and not opt.regularize_bn and not opt.regularize_bias

    schedules = build_param_schedulers(
        cfg.OPTIMIZER,
        batch_size_per_replica=int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA),
        world_size=_world_size(cfg),
        num_nodes=int(cfg.DISTRIBUTED.NUM_NODES),
    )
    total = epochs * IMAGENET_TRAIN_IMAGES // batch
    warmup_end = WARMUP_EPOCHS / epochs
    for where in (0.0, warmup_end / 2, warmup_end, 0.1, 0.25, 0.5, 0.75, 0.9, 0.999):
        expected = deepmind_lr(round(where * total), batch, base_lr, epochs)
        got = schedules.values(where)["lr"]
        assert got == pytest.approx(expected, rel=2e-3, abs=1e-6), (where, got, expected)
    assert schedules.values(warmup_end)["lr"] == pytest.approx(base_lr * batch / 256)

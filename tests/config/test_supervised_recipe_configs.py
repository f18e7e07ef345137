"""The supervised ImageNet recipes (DeiT-S/16, ResNet-50 with mixup/CutMix) compose without
warnings and hold consistent numbers; one training step runs on CPU through their own
transforms, collator, model and loss (two random 224 px images; behind ``slow``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from vissl.data import build_collate_fn
from vissl.data.samplers import SeededSamples
from vissl.data.ssl_transforms import build_transforms
from vissl.losses.build import build_loss
from vissl.models import build_model
from vissl.optimizers import build_optimizer, build_param_schedulers
from vissl.utils.hydra_config import hydra_compose_and_validate

# config -> (lr per base batch, base batch, warm-up epochs, final lr)
RECIPES = {
    "pretrain/supervised/supervised_8gpu_deit_s16": (0.0005, 512, 5, 1e-5),
    "pretrain/supervised/supervised_8gpu_resnet50_cutmixup": (0.1, 256, 5, 0.0),
}


def _compose(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the shipped configs must not warn
        _, cfg = hydra_compose_and_validate([f"config={name}"])
    return cfg


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_numbers(name: str) -> None:
    per_batch, base_batch, warmup_epochs, final = RECIPES[name]
    cfg = _compose(name)
    world = int(cfg.DISTRIBUTED.NUM_NODES) * int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)
    batch = int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA) * world
    schedules = build_param_schedulers(
        cfg.OPTIMIZER, batch_size_per_replica=batch // world, world_size=world
    )
    warmup = warmup_epochs / int(cfg.OPTIMIZER.num_epochs)
    peak = per_batch * batch / base_batch
    assert schedules.values(warmup)["lr"] == pytest.approx(peak, rel=1e-6)
    assert schedules.values(1.0)["lr"] == pytest.approx(final, abs=1e-6)
    assert schedules.values(warmup / 2)["lr"] < peak
    params = cfg.DATA.TRAIN.COLLATE_FUNCTION_PARAMS
    assert params.num_classes == 1000 and cfg.DATA.TRAIN.DROP_LAST


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_trains_one_step_on_cpu(name: str) -> None:
    cfg = _compose(name)
    world = int(cfg.DISTRIBUTED.NUM_NODES) * int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)
    schedules = build_param_schedulers(
        cfg.OPTIMIZER,
        batch_size_per_replica=int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA),
        world_size=world,
    )
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    optimizer = build_optimizer(
        cfg.OPTIMIZER, model, param_schedulers=schedules, model_config=cfg.MODEL
    )
    if "deit" in name:
        unregularized = {
            id(p) for g in optimizer.param_groups if g["weight_decay"] == 0 for p in g["params"]
        }
        assert id(model.trunk.pos_embed) in unregularized
        assert id(model.trunk.cls_token) in unregularized
    transforms = build_transforms(cfg.DATA.TRAIN.TRANSFORMS)
    rng = np.random.RandomState(0)
    samples = []
    for i in range(2):
        image = Image.fromarray(rng.randint(0, 256, (240, 260, 3), dtype=np.uint8))
        sample = {"data": [image], "label": [7 * i], "data_valid": [1], "data_idx": [i]}
        samples.append(transforms(sample))
    out = build_collate_fn(cfg, "TRAIN")(SeededSamples(samples, 1))
    images, target = out["data"][0], out["label"][0]
    assert images[0].shape == (2, 3, 224, 224) and target.shape == (2, 1000)
    loss_fn = build_loss(cfg.LOSS, cfg)
    loss = loss_fn(model(images), target)
    assert torch.isfinite(loss)
    loss.backward()
    optimizer.step()

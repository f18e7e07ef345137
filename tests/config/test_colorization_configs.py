"""The Colorization ImageNet configs compose without warnings, build on the CPU, hold the
numbers their comments state (images per step, iterations per epoch, Zhang et al.'s Adam
rate 3e-5 at 40 images scaled by the square root of the batch ratio, then / 3 and / 10
at epochs 6 and 12 of 14), and one training step runs from a 256 px image through
ImgPil2LabTensor, colorization_collator, alexnet_colorization's conv5 (13 x 13 at 227 px),
the head of 262 bins and colorization_loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from tests.config.test_pretrain_method_configs import (
    _build,
    _compose,
    _iterations_per_epoch,
    _world_size,
)
from vissl.data import build_collate_fn
from vissl.data.ssl_transforms.ssl_transforms_wrapper import build_transforms
from vissl.losses.colorization_loss import ColorizationLoss

# config -> (images per step, iterations per epoch)
COLORIZATION = {
    "pretrain/colorization/colorization_8gpu_alexnet": (320, 4003),
    "pretrain/colorization/colorization_64gpu_alexnet": (1280, 1000),
}


@pytest.mark.parametrize("name", sorted(COLORIZATION))
def test_colorization_config_builds_with_the_numbers_of_its_comments(name: str) -> None:
    images, iterations = COLORIZATION[name]
    cfg = _compose(name)
    assert int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA) * _world_size(cfg) == images
    assert _iterations_per_epoch(cfg) == iterations
    assert cfg.DATA.TRAIN.COLLATE_FUNCTION == "colorization_collator"
    assert cfg.MODEL.INPUT_TYPE == "lab" and cfg.MODEL.TRUNK.ALEXNET.DEFAULT_OUTPUT == "conv5"
    _, loss, schedules, optimizer = _build(cfg)
    assert isinstance(loss, ColorizationLoss) and loss.num_bins == 262
    assert isinstance(optimizer, torch.optim.Adam)
    assert optimizer.defaults["betas"] == (0.9, 0.99)
    assert cfg.OPTIMIZER.weight_decay == pytest.approx(1e-3)
    peak = 3e-5 * math.sqrt(images / 40)
    epochs = int(cfg.OPTIMIZER.num_epochs)
    assert epochs == 14
    assert schedules.values(0.0)["lr"] == pytest.approx(peak, rel=2e-3)
    assert schedules.values(6.5 / epochs)["lr"] == pytest.approx(peak / 3, rel=2e-3)
    assert schedules.values(12.5 / epochs)["lr"] == pytest.approx(peak / 10, rel=2e-3)


def test_one_colorization_step_on_a_256_px_image() -> None:
    cfg = _compose("pretrain/colorization/colorization_8gpu_alexnet")
    model, loss, _, _ = _build(cfg)
    rng = np.random.RandomState(0)
    chain = build_transforms(cfg.DATA.TRAIN.TRANSFORMS)
    samples = [
        chain(
            {
                "data": [Image.fromarray((rng.rand(256, 300, 3) * 255).astype(np.uint8))],
                "label": [0],
                "data_valid": [1],
                "data_idx": [i],
            }
        )
        for i in range(2)
    ]
    out = build_collate_fn(cfg, "TRAIN")(samples)
    data, label = out["data"][0], out["label"][0]
    assert data.shape == (2, 3, 227, 227) and label.shape == (2, 2, 227, 227)
    model.train()
    (logits,) = model(data)
    assert logits.shape == (2, 262, 13, 13)
    value = loss([logits], label)
    value.backward()
    assert math.isfinite(value.item())
    assert float(loss.counts.sum()) == 2 * 13 * 13

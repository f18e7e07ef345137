"""The NPID and PIRL ImageNet configs compose without warnings, build on the CPU (with a
small memory bank: the real one is 1281167 x 128), hold the numbers their comments state,
and one PIRL step runs on a 224 px image through ImgPilToPatchesAndImage,
patch_and_image_collator, the two heads and the loss."""

from __future__ import annotations

import math

import pytest
import torch

from tests.config.test_pretrain_method_configs import (
    IMAGENET_TRAIN_IMAGES,
    _build,
    _compose,
    _iterations_per_epoch,
    _world_size,
)
from vissl.data import build_collate_fn
from vissl.data.ssl_transforms.ssl_transforms_wrapper import build_transforms
from vissl.losses.nce_loss import NCELossWithMemory

SMALL_BANK = "config.LOSS.nce_loss_with_memory.num_train_samples=64"

# config -> (images per step, peak lr, iterations per epoch, noise entries, epochs)
CONFIGS = {
    "pretrain/npid/npid_8gpu_resnet50": (256, 0.03, 5004, 4096, 200),
    "pretrain/npid/npid_64gpu_resnet50": (1024, 0.12, 1251, 4096, 200),
    "pretrain/pirl/pirl_8gpu_resnet50": (256, 0.03, 5004, 32000, 200),
    "pretrain/pirl/pirl_64gpu_resnet50": (1024, 0.12, 1251, 32000, 800),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_builds_with_the_numbers_of_its_comments(name: str) -> None:
    images, peak, iterations, negatives, epochs = CONFIGS[name]
    cfg = _compose(name, SMALL_BANK)
    assert int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA) * _world_size(cfg) == images
    assert _iterations_per_epoch(cfg) == iterations
    assert (
        math.ceil(IMAGENET_TRAIN_IMAGES / _world_size(cfg)) // (images // _world_size(cfg))
        == iterations
    )
    assert peak == pytest.approx(0.03 * images / 256)
    assert cfg.DATA.TRAIN.LABEL_TYPE == "sample_index"  # the bank's entry of each image
    assert int(cfg.OPTIMIZER.num_epochs) == epochs
    _, loss, schedules, _ = _build(cfg)
    assert isinstance(loss, NCELossWithMemory)
    assert (loss.num_negatives, loss.temperature, loss.momentum) == (negatives, 0.07, 0.5)
    assert schedules.values(0.0)["lr"] == pytest.approx(peak)
    if "npid" in name:  # x0.1 at 60% and 80% of the run
        assert schedules.values(0.59)["lr"] == pytest.approx(peak)
        assert schedules.values(0.61)["lr"] == pytest.approx(peak / 10)
        assert schedules.values(0.81)["lr"] == pytest.approx(peak / 100)
    else:
        assert loss.loss_weights == [0.5, 0.5] and loss.update_index == 1
        # VISSL's PIRL config: the cosine ends at 1/1000 of the peak
        assert schedules.values(1.0)["lr"] == pytest.approx(peak / 1000, rel=1e-4)


@pytest.mark.slow
def test_one_pirl_step_on_a_224_px_image() -> None:
    cfg = _compose("pretrain/pirl/pirl_8gpu_resnet50", SMALL_BANK)
    model, loss, _, _ = _build(cfg)
    torch.manual_seed(0)
    image = build_transforms([{"name": "ToPILImage"}], tensor_path=False)(
        {"data": [torch.randint(0, 256, (3, 280, 300), dtype=torch.uint8)], "label": [0]}
    )["data"][0]
    chain = build_transforms(cfg.DATA.TRAIN.TRANSFORMS)
    samples = [
        chain({"data": [image], "label": [i], "data_valid": [1], "data_idx": [i]}) for i in (3, 7)
    ]
    batch = build_collate_fn(cfg, "TRAIN")(samples)
    images, patches = batch["images"][0], batch["patches"][0]
    assert images.shape == (2, 3, 224, 224) and patches.shape == (18, 3, 64, 64)
    model.train()
    out = model({"images": images, "patches": patches})
    assert [o.shape for o in out] == [(2, 128), (2, 128)]
    value = loss(out, batch["label"][0])
    value.backward()
    assert math.isfinite(value.item())

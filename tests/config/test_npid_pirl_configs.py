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
from vissl.optimizers.param_scheduler import build_param_schedulers

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


# NPID++: VISSL's configs/config/pretrain/npid/npid++_4nodes_resnet.yaml, written out:
# 32000 noise entries, 800 epochs, a cosine lr from 0.03 per 256 images to 1/1000 of it,
# weight decay 1e-4 (not on BN), jitter 0.4 x 4 then a crop of 8-100%, no grayscale.
# config -> (images per step, peak lr, iterations per epoch)
NPID_PLUS_PLUS = {
    "pretrain/npid/npid++_4nodes_resnet": (1024, 0.12, 1251),
    "pretrain/npid/npid++_8gpu_resnet50": (256, 0.03, 5004),
}


@pytest.mark.parametrize("name", sorted(NPID_PLUS_PLUS))
def test_npid_plus_plus_config_is_vissls_recipe(name: str) -> None:
    images, peak, iterations = NPID_PLUS_PLUS[name]
    cfg = _compose(name, SMALL_BANK)
    assert int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA) * _world_size(cfg) == images
    assert _iterations_per_epoch(cfg) == iterations
    assert peak == pytest.approx(0.03 * images / 256)
    assert cfg.DATA.TRAIN.LABEL_TYPE == "sample_index"
    transforms = cfg.DATA.TRAIN.TRANSFORMS
    assert [t["name"] for t in transforms] == [
        "ColorJitter",
        "RandomResizedCrop",
        "RandomHorizontalFlip",
        "ToTensor",
        "Normalize",
    ]  # no grayscale
    jitter, crop = transforms[0], transforms[1]
    assert [jitter[k] for k in ("brightness", "contrast", "saturation", "hue")] == [0.4] * 4
    assert crop["size"] == 224 and list(crop["scale"]) == [0.08, 1.0]
    opt = cfg.OPTIMIZER
    assert int(opt.num_epochs) == 800 and opt.name == "sgd" and float(opt.momentum) == 0.9
    assert float(opt.weight_decay) == pytest.approx(1e-4)
    assert not opt.regularize_bn and opt.regularize_bias
    _, loss, schedules, _ = _build(cfg)
    assert isinstance(loss, NCELossWithMemory)
    assert (loss.num_negatives, loss.temperature, loss.momentum) == (32000, 0.07, 0.5)
    end = peak / 1000
    for epoch in (0, 80, 240, 400, 560, 720, 799):
        expected = end + (peak - end) * (1 + math.cos(math.pi * epoch / 800)) / 2
        assert schedules.values(epoch / 800)["lr"] == pytest.approx(expected, rel=1e-6)
    assert schedules.values(400 / 800)["lr"] >= 0.1 * peak  # F6: no collapsed schedule


def test_npid_plus_plus_lr_follows_the_global_batch() -> None:
    """auto_lr_scaling, as VISSL's NPID++: 4 GPUs instead of 8 halve the peak and the end."""
    cfg = _compose("pretrain/npid/npid++_8gpu_resnet50", "config.DISTRIBUTED.NUM_PROC_PER_NODE=4")
    schedules = build_param_schedulers(
        cfg.OPTIMIZER, batch_size_per_replica=32, world_size=_world_size(cfg), num_nodes=1
    )
    assert schedules.values(0.0)["lr"] == pytest.approx(0.015)
    assert schedules.values(1.0)["lr"] == pytest.approx(0.015 / 1000)


def test_npid_docs_and_headers_send_npid_plus_plus_users_to_its_recipe() -> None:
    """The NPID page and config headers used to say "NPID++ is this recipe with
    num_negatives: 32000 and more epochs", which keeps the drops at epochs 120 and 160
    (80% of an 800-epoch run at 1% of the peak). Every NPID++ config they name composes
    to a cosine schedule; none of them tells to override the NPID config's negatives."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs/methods/npid.md").read_text()
    headers = [
        "".join(line for line in path.open() if line.startswith("#"))
        for path in sorted((root / "configs/config/pretrain/npid").glob("npid_*.yaml"))
    ]
    assert len(headers) == 2
    for text in (page, *headers):
        assert not re.search(r"num_negatives[=:]\s*32000", text)
        named = set(re.findall(r"pretrain/npid/npid\+\+_\w+", text))
        assert named == set(NPID_PLUS_PLUS), named
    for name in NPID_PLUS_PLUS:
        assert _compose(name, SMALL_BANK).OPTIMIZER.param_schedulers.lr.name == "cosine"

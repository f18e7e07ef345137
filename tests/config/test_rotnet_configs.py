"""The RotNet ImageNet configs compose without warnings, build on the CPU, hold the
numbers their comments state (rows per step, VISSL's learning-rate steps, warm-up,
iterations per epoch), and one training step runs through rotnet_collator on a 224 px image; the digits
mid-trunk kNN probe (RotNet's and Jigsaw's) reads the tap its comments name."""

from __future__ import annotations

import math

import pytest
import torch

from tests.config.test_pretrain_method_configs import (
    IMAGENET_TRAIN_IMAGES,
    _build,
    _compose,
    _world_size,
)
from vissl.data import build_collate_fn
from vissl.data.ssl_transforms.ssl_transforms_wrapper import build_transforms
from vissl.losses.cross_entropy_multiple_output_single_target import (
    CrossEntropyMultipleOutputSingleTargetLoss,
)
from vissl.optimizers.larc import LARC

# config -> (rows per step, peak lr, iterations per epoch, warm-up epochs); VISSL's
# schedule: 0.1 per 256 images (a quarter of the rows), x0.1 at epochs 30, 60, 90, 100
ROTNET = {
    "pretrain/rotnet/rotnet_8gpu_resnet50": (1024, 0.1, 5004, 0),
    "pretrain/rotnet/rotnet_64gpu_resnet50": (4096, 0.4, 1251, 5),
}


@pytest.mark.parametrize("name", sorted(ROTNET))
def test_rotnet_config_builds_with_the_numbers_of_its_comments(name: str) -> None:
    rows, peak, iterations, warmup_epochs = ROTNET[name]
    cfg = _compose(name)
    batch = int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
    angles = int(cfg.DATA.TRAIN.COLLATE_FUNCTION_PARAMS.num_angles)
    assert cfg.DATA.TRAIN.COLLATE_FUNCTION == "rotnet_collator" and angles == 4
    assert angles * batch * _world_size(cfg) == rows
    assert math.ceil(IMAGENET_TRAIN_IMAGES / _world_size(cfg)) // batch == iterations
    _, loss, schedules, optimizer = _build(cfg)
    assert isinstance(loss, CrossEntropyMultipleOutputSingleTargetLoss)
    assert not isinstance(optimizer, LARC) and not cfg.OPTIMIZER.nesterov
    assert peak == pytest.approx(0.1 * rows / angles / 256)
    epochs = int(cfg.OPTIMIZER.num_epochs)
    assert epochs == 105
    start = peak / 4 if warmup_epochs else peak
    assert schedules.values(0.0)["lr"] == pytest.approx(start)
    for epoch, value in [
        (warmup_epochs, peak),
        (29.5, peak),
        (30.5, peak / 10),
        (60.5, peak / 100),
        (104.5, peak / 1e4),
    ]:
        assert schedules.values(epoch / epochs)["lr"] == pytest.approx(value, rel=1e-4)


@pytest.mark.slow
def test_one_rotnet_step_on_a_224_px_image() -> None:
    """The crop chain, rotnet_collator, ResNet-50 and its 4-way head fit end to end."""
    cfg = _compose("pretrain/rotnet/rotnet_8gpu_resnet50")
    model, loss, _, _ = _build(cfg)
    torch.manual_seed(0)
    image = torch.randint(0, 256, (3, 256, 300), dtype=torch.uint8)
    chain = build_transforms(cfg.DATA.TRAIN.TRANSFORMS)
    sample = chain({"data": [image], "label": [0], "data_valid": [1], "data_idx": [0]})
    out = build_collate_fn(cfg, "TRAIN")([sample])
    data, label = out["data"][0], out["label"][0]
    assert data.shape == (4, 3, 224, 224) and label.tolist() == [0, 1, 2, 3]
    model.train()
    logits = model(data)
    assert logits[0].shape == (4, 4)
    value = loss(logits, label)
    value.backward()
    assert math.isfinite(value.item())


def test_digits_mid_trunk_probe_reads_res3_pooled_to_2x2() -> None:
    """nn_digits_quick_start_res3 (the digits RotNet and Jigsaw probe) holds what its
    comments state: quick_start's trunk, frozen, with four taps (res2, res3, res4 pooled to
    2 x 2, res5avg), the kNN reading res3 = 64 channels x 2 x 2 = 256 values of the trunk it
    loads, at 8 px and at Jigsaw's 24 px."""
    from vissl.models import build_model

    cfg = _compose("benchmark/nearest_neighbor/digits/nn_digits_quick_start_res3")
    assert cfg.NEAREST_NEIGHBOR.FEATURE_TYPE == "res3" and cfg.NEAREST_NEIGHBOR.TOPK == 20
    assert cfg.DATA.TEST.TRANSFORMS[0].size == 8
    pretrain = _compose("digits/rotnet")
    assert cfg.MODEL.TRUNK == pretrain.MODEL.TRUNK
    probe = build_model(cfg.MODEL, cfg.OPTIMIZER).eval()
    trained = build_model(pretrain.MODEL, pretrain.OPTIMIZER).eval()
    with torch.no_grad():
        for p in trained.trunk.parameters():
            p.add_(0.01 * torch.randn_like(p))  # differs from the probe's random init
    probe.trunk.base_model.load_state_dict(trained.trunk.state_dict())
    for size in (8, 24):
        x = torch.randn(3, 3, size, size)
        with torch.no_grad():
            feats = probe(x)
            # res3 by hand: the trained trunk's stem, layer1 and layer2 (eval mode),
            # average-pooled to 2 x 2 and flattened
            blocks = trained.trunk._feature_blocks
            h = x
            for name in ("conv1", "bn1", "conv1_relu", "maxpool", "layer1", "layer2"):
                h = blocks[name](h)
            res3 = torch.nn.functional.adaptive_avg_pool2d(h, 2).flatten(1)
        assert [tuple(f.shape) for f in feats] == [(3, 128), (3, 256), (3, 512), (3, 256)]
        assert h.shape[1:] == (64, size // 2, size // 2)
        torch.testing.assert_close(feats[1], res3)

"""The DeepCluster-v2 ImageNet configs compose without warnings, build on the CPU and hold
the numbers their comments state (batch, learning rates, warm-up, iterations per epoch,
memory rows per GPU); the swav_head's 3 x 3000 prototypes are the loss's centroids and
frozen; one training step of ResNet-50 on a 2x224 + 6x96 multi-crop batch."""

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
from vissl.losses.deepclusterv2_loss import DeepClusterV2Loss
from vissl.optimizers.larc import LARC

# config -> (global batch, peak lr, epochs, iterations per epoch, memory rows per GPU)
DEEPCLUSTER_V2 = {
    "pretrain/deepcluster_v2/deepclusterv2_8gpu_resnet50": (512, 0.6, 400, 2502, 160128),
    "pretrain/deepcluster_v2/deepclusterv2_64gpu_resnet50": (4096, 4.8, 800, 312, 19968),
}


@pytest.mark.parametrize("name", sorted(DEEPCLUSTER_V2))
def test_config_builds_with_the_numbers_of_its_comments(name: str) -> None:
    batch, peak, epochs, iterations, rows = DEEPCLUSTER_V2[name]
    cfg = _compose(name)
    world = _world_size(cfg)
    per_gpu = int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
    assert per_gpu * world == batch and int(cfg.OPTIMIZER.num_epochs) == epochs
    assert math.ceil(IMAGENET_TRAIN_IMAGES / world) // per_gpu == iterations
    crops = cfg.DATA.TRAIN.TRANSFORMS[0]
    assert (crops.total_num_crops, crops.size_crops, crops.num_crops) == (8, [224, 96], [2, 6])
    model, loss, schedules, optimizer = _build(cfg)
    assert isinstance(loss, DeepClusterV2Loss) and isinstance(optimizer, LARC)
    assert loss.num_clusters == [3000, 3000, 3000] and loss.embedding_dim == 128
    assert (loss.num_crops, loss.crops_for_mb, loss.temperature) == (8, [0, 1], 0.1)
    # sized like a run of `world` processes on ImageNet (the run sets num_train_samples)
    loss.world_size = world
    assert loss.memory_size(IMAGENET_TRAIN_IMAGES) == rows == iterations * per_gpu
    # the prototypes are the centroids: frozen, so not in the optimizer
    (head,) = model.heads
    frozen = [layer.weight for layer in head.prototype_layers()]
    assert len(frozen) == 3 and not any(w.requires_grad for w in frozen)
    optimized = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert not optimized & {id(w) for w in frozen}
    # learning rate: peak / 16 -> peak over 10 epochs, then cosine to peak / 1000 (the SwAV
    # repo's 0.3 -> 4.8 -> 0.0048 at batch 4096, scaled with the batch)
    warmup = 10 / epochs
    assert schedules.values(0.0)["lr"] == pytest.approx(peak / 16)
    assert schedules.values(warmup)["lr"] == pytest.approx(peak, rel=1e-4)
    assert schedules.values(1.0)["lr"] == pytest.approx(peak / 1000, rel=1e-4)
    middle = warmup + (1 - warmup) / 2  # halfway through the cosine
    assert schedules.values(middle)["lr"] == pytest.approx((peak + peak / 1000) / 2, rel=1e-3)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_one_step_on_a_multicrop_batch(one_thread) -> None:
    """2 images of 2 x 224 + 6 x 96 crops through ResNet-50 and the swav_head; the loss
    trains the trunk and the projection, not the prototypes, and writes the memory."""
    torch.manual_seed(0)
    cfg = _compose(
        "pretrain/deepcluster_v2/deepclusterv2_8gpu_resnet50",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=2",
    )
    model, loss, schedules, optimizer = _build(cfg)
    loss.world_size = 1
    loss.allocate(4)  # 4 samples, 4 memory rows
    for h in range(3):
        loss.centroids(h).copy_(torch.nn.functional.normalize(torch.randn(3000, 128), dim=1))
        loss.assignments[h].copy_(torch.randint(0, 3000, (4,)))
    loss._copy_centroids_to_prototypes()
    model.train()
    crops = [torch.randn(2, 3, 224, 224) for _ in range(2)]
    crops += [torch.randn(2, 3, 96, 96) for _ in range(6)]
    schedules.apply(optimizer, 0.5, None)
    prototypes = model.heads[0].prototypes0.weight.detach().clone()
    conv = model.trunk._feature_blocks.conv1.weight.detach().clone()
    (output,) = model(crops)  # one head: [embedding, scores_0, scores_1, scores_2]
    assert [tuple(o.shape) for o in output] == [(16, 128)] + [(16, 3000)] * 3
    value = loss(output, torch.tensor([3, 1] * 8))
    optimizer.zero_grad()
    value.backward()
    optimizer.step()
    assert math.isfinite(value.item())
    assert abs(value.item() - math.log(3000)) < 2.0  # near uniform at init
    assert torch.equal(model.heads[0].prototypes0.weight, prototypes)
    assert not torch.equal(model.trunk._feature_blocks.conv1.weight, conv)
    assert loss.local_memory_index[:2].tolist() == [3, 1] and loss.start_idx == 2

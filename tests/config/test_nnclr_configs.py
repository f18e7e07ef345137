"""The NNCLR ImageNet configs compose, build on the CPU without data, and hold consistent
numbers: the learning rate recomputed from the batch (0.3 per 256 images, 10 warm-up
epochs, cosine to 0), the paper's support set of 98304 (one queue, the same on every
GPU), its heads (projector 2048-2048-256 with a BatchNorm after every Linear, predictor
4096-256), temperature 0.1; one training step on a fake batch of small images fits end
to end and writes the support set."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from vissl.losses.build import build_loss
from vissl.losses.nnclr_loss import NNCLRLoss
from vissl.models import build_model
from vissl.optimizers import build_optimizer
from vissl.optimizers.lars import LARS
from vissl.optimizers.param_scheduler import build_param_schedulers
from vissl.utils.hydra_config import hydra_compose_and_validate

IMAGENET_TRAIN_IMAGES = 1281167
PAPER_SUPPORT_SET = 98304
PAPER_BATCH = 4096

# config -> (GPUs, iterations per epoch written in its comments, steps to fill the queue)
CONFIGS = {
    "pretrain/nnclr/nnclr_8gpu_resnet50": (8, 2502, 192),
    "pretrain/nnclr/nnclr_64gpu_resnet50": (64, 312, 24),
}


def _compose(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the shipped configs must not warn
        _, cfg = hydra_compose_and_validate([f"config={name}"])
    return cfg


def _world_size(cfg) -> int:
    return int(cfg.DISTRIBUTED.NUM_NODES) * int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)


def _build(cfg):
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss = build_loss(cfg.LOSS, cfg)
    loss.bind_model(model)
    schedules = build_param_schedulers(
        cfg.OPTIMIZER,
        batch_size_per_replica=int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA),
        world_size=_world_size(cfg),
        num_nodes=int(cfg.DISTRIBUTED.NUM_NODES),
    )
    optimizer = build_optimizer(cfg.OPTIMIZER, model, param_schedulers=schedules)
    return model, loss, schedules, optimizer


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_builds_with_consistent_numbers(name: str) -> None:
    gpus, iterations_per_epoch, fill_steps = CONFIGS[name]
    cfg = _compose(name)
    assert _world_size(cfg) == gpus
    model, loss, schedules, optimizer = _build(cfg)
    assert cfg.DATA.TRAIN.DATASET_NAMES == ["imagenet1k_folder"]
    assert cfg.DATA.TRAIN.DROP_LAST

    # LARS at 0.3 per 256 images: 0 at the start, the scaled peak after 10 epochs, 0 at the end
    assert isinstance(optimizer, LARS)
    assert optimizer.defaults["exclude_bias_and_norm"]
    assert cfg.OPTIMIZER.weight_decay == pytest.approx(1e-6)
    batch = int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
    global_batch = gpus * batch
    peak = 0.3 * global_batch / 256
    assert peak == pytest.approx({8: 0.6, 64: 4.8}[gpus])
    warmup = 10 / int(cfg.OPTIMIZER.num_epochs)
    assert schedules.values(0.0)["lr"] == 0.0
    assert schedules.values(warmup)["lr"] == pytest.approx(peak, rel=1e-6)
    assert schedules.values(warmup / 2)["lr"] == pytest.approx(peak / 2, rel=1e-6)
    assert schedules.values(0.5 + warmup / 2)["lr"] == pytest.approx(peak / 2, rel=1e-3)
    assert schedules.values(1.0)["lr"] == pytest.approx(0.0, abs=1e-9)

    # the iteration counts written in the config's comments
    per_rank = math.ceil(IMAGENET_TRAIN_IMAGES / gpus)
    assert per_rank // batch == iterations_per_epoch

    # the loss: T 0.1, the paper's support set (one global queue: each step writes the
    # global batch's view-1 projections), filled within an epoch
    assert isinstance(loss, NNCLRLoss)
    assert loss.temperature == 0.1 and loss.embedding_dim == 256
    assert loss.queue_size == PAPER_SUPPORT_SET
    assert loss.queue_size // global_batch == fill_steps < iterations_per_epoch
    if global_batch == PAPER_BATCH:  # the paper's queue spans 98304 / 4096 = 24 steps
        assert fill_steps == PAPER_SUPPORT_SET // PAPER_BATCH

    # the paper's heads: projector (Linear-BN-ReLU) x 2 + Linear-BN to 256 (all its
    # Linear layers followed by BN, ReLU after all but the last); predictor Linear-BN-ReLU
    # + Linear
    projector, predictor = model.heads
    linears = [m for m in projector.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (2048, 2048),
        (2048, 2048),
        (2048, 256),
    ]
    linears = [m for m in predictor.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(256, 4096), (4096, 256)]
    assert sum(isinstance(m, torch.nn.BatchNorm1d) for m in model.heads.modules()) == 4
    last = projector.clf[-1]
    assert isinstance(last, torch.nn.BatchNorm1d) and last.num_features == 256 and last.affine
    assert not isinstance(predictor.clf[-1], torch.nn.BatchNorm1d)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_one_training_step_on_a_fake_batch(one_thread) -> None:
    """ResNet-50 with both heads on 4 samples x 2 views of 64 px: the loss is the
    InfoNCE over 4 candidates before the queue is full (about ln 4 at init), the model
    moves, and the 4 view-1 projections are written to the support set."""
    torch.manual_seed(0)
    cfg = _compose("pretrain/nnclr/nnclr_64gpu_resnet50")
    model, loss, schedules, optimizer = _build(cfg)
    model.train()
    loss.train()
    schedules.apply(optimizer, 0.1, None)
    x = torch.randn(8, 3, 64, 64)
    before = model.heads[1].clf[0].weight.detach().clone()
    value = loss(model(x))
    optimizer.zero_grad()
    value.backward()
    optimizer.step()
    assert torch.isfinite(value)
    assert 0 < value.item() < math.log(4) + 2 / loss.temperature
    assert not torch.equal(model.heads[1].clf[0].weight, before)
    assert loss.written.item() == 4
    torch.testing.assert_close(loss.queue[:4].norm(dim=1), torch.ones(4))
    assert not loss.queue[4:].any()

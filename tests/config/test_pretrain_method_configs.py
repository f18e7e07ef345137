"""The DINO and Barlow Twins ImageNet configs compose, build, and hold consistent numbers.

No data and no process group: each config is composed and validated, then its model, loss
(with the DINO teacher), schedules and optimizer are built on the CPU. The iteration counts
written in the configs (frozen last layer, teacher-temperature warm-up) and the learning
rates are recomputed from ImageNet-1k's size and the global batch, so a change of batch
size or GPU count that forgets one of them fails here. One DINO ViT-S/16 training step on
a fake multi-crop batch (one image: 2 x 224 px + 10 x 96 px crops) checks that the shapes
fit end to end.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from vissl.losses.barlow_twins_loss import BarlowTwinsLoss
from vissl.losses.build import build_loss
from vissl.losses.dino_loss import DINOLoss
from vissl.models import build_model
from vissl.optimizers import build_optimizer
from vissl.optimizers.lars import LARS
from vissl.optimizers.param_scheduler import build_param_schedulers
from vissl.utils.hydra_config import hydra_compose_and_validate

IMAGENET_TRAIN_IMAGES = 1281167

# config -> (optimizer class, lr per 256 images, warm-up epochs, end lr,
#            teacher-temperature warm-up epochs or None)
DINO = {
    "pretrain/dino/dino_8gpu_vits16": (torch.optim.AdamW, 0.0005, 10, 1e-6, 30),
    "pretrain/dino/dino_64gpu_vits16": (torch.optim.AdamW, 0.0005, 10, 1e-6, 30),
    "pretrain/dino/dino_8gpu_resnet50": (torch.optim.SGD, 0.03, 10, 1e-6, 0),
    "pretrain/dino/dino_64gpu_resnet50": (LARS, 0.3, 10, 0.0048, 50),
}
BARLOW_TWINS = {
    "pretrain/barlow_twins/barlow_twins_8gpu_resnet": (LARS, 0.2, 10, None, None),
    "pretrain/barlow_twins/barlow_twins_64gpu_resnet": (LARS, 0.2, 10, None, None),
}
CONFIGS = {**DINO, **BARLOW_TWINS}


def _compose(name: str, *overrides: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the shipped configs must not warn
        _, cfg = hydra_compose_and_validate([f"config={name}", *overrides])
    return cfg


def _world_size(cfg) -> int:
    return int(cfg.DISTRIBUTED.NUM_NODES) * int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)


def _iterations_per_epoch(cfg) -> int:
    """What the loader gives: the sampler pads to equal shards, DROP_LAST drops the rest."""
    assert cfg.DATA.TRAIN.DROP_LAST
    per_rank = math.ceil(IMAGENET_TRAIN_IMAGES / _world_size(cfg))
    return per_rank // int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)


def _build(cfg):
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss = build_loss(cfg.LOSS, cfg)
    if callable(getattr(loss, "bind_model", None)):
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
def test_config_builds_with_consistent_numbers(name):
    cfg = _compose(name)
    optimizer_cls, base_lr, warmup_epochs, end_lr, temp_epochs = CONFIGS[name]
    model, loss, schedules, optimizer = _build(cfg)
    assert isinstance(optimizer, optimizer_cls)
    assert cfg.DATA.TRAIN.DATASET_NAMES == ["imagenet1k_folder"]

    # The learning rate: 0 at the start, the linearly scaled peak after the warm-up.
    global_batch = _world_size(cfg) * int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA)
    peak = base_lr * global_batch / 256
    warmup = warmup_epochs / int(cfg.OPTIMIZER.num_epochs)
    assert schedules.values(0.0)["lr"] == 0.0
    assert schedules.values(warmup)["lr"] == pytest.approx(peak, rel=1e-6)
    assert schedules.values(warmup / 2)["lr"] == pytest.approx(peak / 2, rel=1e-6)
    assert schedules.values(1.0)["lr"] == pytest.approx(end_lr or peak * 0.001, rel=1e-3)

    iterations = _iterations_per_epoch(cfg)
    if name in DINO:
        assert isinstance(loss, DINOLoss)
        assert loss.teacher is not None
        assert not any(p.requires_grad for p in loss.teacher.parameters())
        assert loss.num_crops == cfg.DATA.TRAIN.TRANSFORMS[0].total_num_crops
        assert loss.output_dim == model.heads[0].output_dim
        # The last layer is frozen for exactly one epoch.
        assert cfg.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP == [
            ["module.heads.0.prototypes0.weight", iterations]
        ]
        assert loss.teacher_temp_warmup_iters == temp_epochs * iterations
        if cfg.MODEL.TRUNK.NAME == "vision_transformer":
            _check_vit_regularization(model, schedules, optimizer)
    else:
        assert isinstance(loss, BarlowTwinsLoss)
        assert loss.embedding_dim == 8192
        assert optimizer.defaults["exclude_bias_and_norm"]
        # The projector: Linear-BN-ReLU, Linear-BN-ReLU, Linear, no biases.
        layers = [m for m in model.heads.modules() if not list(m.children())]
        kinds = [type(m).__name__ for m in layers]
        assert kinds == ["Linear", "BatchNorm1d", "ReLU"] * 2 + ["Linear"]
        assert all(m.bias is None for m in layers if isinstance(m, torch.nn.Linear))


def _check_vit_regularization(model, schedules, optimizer):
    """AdamW's weight decay: 0.04 -> 0.4 on every parameter but the biases and the 1-D
    ones (DINO's utils.get_params_groups: pos_embed and cls_token are decayed)."""
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        params = [(names[id(p)], p) for p in group["params"]]
        if group["param_group_name"] in ("trunk_regularized", "head_regularized"):
            assert group["weight_decay"] == pytest.approx(0.04)
            assert not any(n.endswith(".bias") or p.ndim == 1 for n, p in params)
        else:
            assert group["weight_decay"] == 0.0
            assert all(n.endswith(".bias") or p.ndim == 1 for n, p in params)
    assert schedules.values(1.0)["weight_decay"] == pytest.approx(0.4, rel=1e-6)


@pytest.fixture
def one_thread():
    # Two threads contend with each other on a loaded 2-core machine: this step takes
    # about 3 s on one thread and 15 s on two (measured under load).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_dino_vits16_trains_one_step_on_a_fake_batch(one_thread):
    torch.manual_seed(0)
    cfg = _compose("pretrain/dino/dino_8gpu_vits16")
    model, loss, schedules, optimizer = _build(cfg)
    model.train()
    loss.train()
    batch = 1
    crops = [torch.randn(batch, 3, 224, 224) for _ in range(2)]
    crops += [torch.randn(batch, 3, 96, 96) for _ in range(10)]
    schedules.apply(optimizer, 0.1, None)  # the peak learning rate
    student_before = model.trunk.pos_embed.detach().clone()
    teacher_before = loss.teacher.trunk.pos_embed.detach().clone()

    output = model(crops)
    with torch.no_grad():
        teacher_output = loss.teacher(loss.teacher_input(crops))
    value = loss(output, teacher_output=teacher_output[0])
    optimizer.zero_grad()
    value.backward()
    optimizer.step()

    assert torch.isfinite(value)
    # Uniform-ish outputs at init: close to ln(65536), the collapse level.
    assert abs(value.item() - math.log(65536)) < 2.0
    assert loss.center.abs().sum() > 0
    assert not torch.equal(model.trunk.pos_embed, student_before)
    assert torch.equal(loss.teacher.trunk.pos_embed, teacher_before)

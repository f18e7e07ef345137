"""The MoCo v3 ImageNet configs compose, build on the CPU without data, and hold consistent
numbers: the learning rate recomputed from the batch (LARS 0.6 per 256 images over 10
warm-up epochs for ResNet-50, AdamW 1.5e-4 per 256 over 40 for ViT-S, cosine to 0), the
iteration counts written in their comments, the paper's heads, temperatures (1.0 ResNet,
0.2 ViT) and momentum; the ViT-S (12 heads) has its patch projection frozen and out of
the optimizer; one ViT-S training step on a fake batch fits end to end."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from vissl.losses.build import build_loss
from vissl.losses.moco_v3_loss import MoCoV3Loss
from vissl.models import build_model
from vissl.optimizers import build_optimizer
from vissl.optimizers.lars import LARS
from vissl.optimizers.param_scheduler import build_param_schedulers
from vissl.utils.hydra_config import hydra_compose_and_validate

IMAGENET_TRAIN_IMAGES = 1281167
ROOT = "pretrain/moco_v3/"

# config -> (GPUs, batch per GPU, iterations per epoch in its comments, optimizer,
#            lr per 256 images, warm-up epochs, epochs, temperature)
CONFIGS = {
    "moco_v3_8gpu_resnet50": (8, 128, 1251, LARS, 0.6, 10, 100, 1.0),
    "moco_v3_64gpu_resnet50": (64, 64, 312, LARS, 0.6, 10, 100, 1.0),
    "moco_v3_8gpu_vits16": (8, 128, 1251, torch.optim.AdamW, 1.5e-4, 40, 300, 0.2),
    "moco_v3_64gpu_vits16": (64, 64, 312, torch.optim.AdamW, 1.5e-4, 40, 300, 0.2),
}
PEAKS = {  # written out: the arithmetic the configs' comments state
    "moco_v3_8gpu_resnet50": 2.4,  # 0.6 x 1024 / 256
    "moco_v3_64gpu_resnet50": 9.6,  # 0.6 x 4096 / 256
    "moco_v3_8gpu_vits16": 6e-4,  # 1.5e-4 x 1024 / 256
    "moco_v3_64gpu_vits16": 2.4e-3,  # 1.5e-4 x 4096 / 256
}


def _compose(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the shipped configs must not warn
        _, cfg = hydra_compose_and_validate([f"config={ROOT}{name}"])
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


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def layout(head: torch.nn.Module) -> list[str]:
    """A head's layers in order: ``Linear`` (``+b`` with a bias), ``BN`` (``BN-`` without
    affine), ``ReLU``."""
    names = []
    for m in head.modules():
        if isinstance(m, torch.nn.Linear):
            names.append("Linear+b" if m.bias is not None else "Linear")
        elif isinstance(m, torch.nn.BatchNorm1d):
            names.append("BN" if m.affine else "BN-")
        elif isinstance(m, torch.nn.ReLU):
            names.append("ReLU")
    return names


# moco/builder.py, MoCo._build_mlp: Linear layers without bias, BN + ReLU after the hidden
# ones, BatchNorm1d(affine=False) after the last with last_bn. MoCo_ResNet: 2-layer
# projector with last_bn, 2-layer predictor without; MoCo_ViT: 3-layer projector and
# 2-layer predictor, both with last_bn.
HIDDEN = ["Linear", "BN", "ReLU"]
AUTHORS_LAYOUT = {
    "resnet": ([*HIDDEN, "Linear", "BN-"], [*HIDDEN, "Linear"]),
    "vits": ([*HIDDEN, *HIDDEN, "Linear", "BN-"], [*HIDDEN, "Linear", "BN-"]),
}


def _linears(module: torch.nn.Module) -> list[tuple[int, int]]:
    return [
        (m.in_features, m.out_features) for m in module.modules() if isinstance(m, torch.nn.Linear)
    ]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_builds_with_consistent_numbers(name: str, one_thread) -> None:
    gpus, batch, iterations, opt_class, per_256, warm, epochs, tau = CONFIGS[name]
    cfg = _compose(name)
    assert _world_size(cfg) == gpus
    assert int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA) == batch
    assert cfg.DATA.TRAIN.DATASET_NAMES == ["imagenet1k_folder"]
    assert cfg.DATA.TRAIN.DROP_LAST
    assert int(cfg.OPTIMIZER.num_epochs) == epochs
    model, loss, schedules, optimizer = _build(cfg)

    # the lr: linear in the global batch, warm-up from 0, cosine to 0
    assert isinstance(optimizer, opt_class)
    peak = per_256 * gpus * batch / 256
    assert peak == pytest.approx(PEAKS[name])
    assert cfg.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.base_value == pytest.approx(per_256)
    warmup = warm / epochs
    assert schedules.values(0.0)["lr"] == 0.0
    assert schedules.values(warmup / 2)["lr"] == pytest.approx(peak / 2, rel=1e-6)
    assert schedules.values(warmup)["lr"] == pytest.approx(peak, rel=1e-6)
    middle = warmup + (1 - warmup) / 2  # halfway down the cosine
    assert schedules.values(middle)["lr"] == pytest.approx(peak / 2, rel=1e-3)
    assert schedules.values(1.0)["lr"] == pytest.approx(0.0, abs=1e-9)

    # the iteration counts in the comments: what the sampler and DROP_LAST give
    assert math.ceil(IMAGENET_TRAIN_IMAGES / gpus) // batch == iterations

    # the loss and its momentum encoder (the model less its predictor)
    assert isinstance(loss, MoCoV3Loss)
    assert (loss.temperature, loss.momentum, loss.embedding_dim) == (tau, 0.99, 256)
    assert loss.target_network is not None and len(loss.target_network.heads) == 1
    projector, predictor = model.heads
    assert _linears(predictor) == [(256, 4096), (4096, 256)]
    grouped = {id(p) for g in optimizer.param_groups for p in g["params"]}
    # the heads' layers as moco/builder.py builds them; ResNets with zero_init_residual
    # (main_moco.py builds them so)
    assert (layout(projector), layout(predictor)) == AUTHORS_LAYOUT[
        "resnet" if "resnet" in name else "vits"
    ]
    if "resnet" in name:
        assert cfg.MODEL.TRUNK.RESNETS.ZERO_INIT_RESIDUAL is True
        assert _linears(projector) == [(2048, 4096), (4096, 256)]
        assert optimizer.defaults["exclude_bias_and_norm"]
        assert cfg.OPTIMIZER.weight_decay == pytest.approx(1e-6)
        assert len(grouped) == sum(1 for _ in model.parameters())
    else:
        assert _linears(projector) == [(384, 4096), (4096, 4096), (4096, 256)]
        trunk = model.trunk
        assert trunk.embed_dim == 384 and len(trunk.blocks) == 12
        assert trunk.blocks[0].attn.num_heads == 12  # MoCo v3's ViT-S, not DeiT-S's 6
        assert cfg.OPTIMIZER.weight_decay == pytest.approx(0.1)
        frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
        # the random patch projection and the fixed sin-cos position embedding
        assert sorted(frozen) == [
            "trunk.patch_embed.proj.bias",
            "trunk.patch_embed.proj.weight",
            "trunk.pos_embed",
        ]
        assert len(grouped) == sum(1 for _ in model.parameters()) - 3


@pytest.mark.slow
def test_one_vit_training_step_on_a_fake_batch(one_thread) -> None:
    """ViT-S/16 with both heads on 2 samples x 2 views of 64 px (a 4 x 4 grid): the loss
    is about 2 x 2 tau ln 2 at init, the blocks move, the patch projection does not."""
    torch.manual_seed(0)
    cfg = _compose("moco_v3_64gpu_vits16")
    model, loss, schedules, optimizer = _build(cfg)
    model.train()
    loss.train()
    schedules.apply(optimizer, 0.5, None)
    x = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        keys = loss.target_network(x)[0]
    patch = model.trunk.patch_embed.proj.weight.detach().clone()
    qkv = model.trunk.blocks[0].attn.qkv.weight.detach().clone()
    value = loss(model(x), teacher_output=keys)
    optimizer.zero_grad()
    value.backward()
    optimizer.step()
    assert torch.isfinite(value)
    assert 0 < value.item() < 2 * 2 * loss.temperature * (math.log(2) + 1 / loss.temperature)
    assert torch.equal(model.trunk.patch_embed.proj.weight, patch)
    assert not torch.equal(model.trunk.blocks[0].attn.qkv.weight, qkv)

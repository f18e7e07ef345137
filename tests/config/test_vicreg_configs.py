"""The VICReg configs compose without warnings and build on the CPU without data. The
ImageNet ones hold consistent numbers: the learning rate recomputed from the batch (LARS
at 0.3 per 256 images for the authors' 100-epoch single-node recipe, 0.2 per 256 for the
paper's 1000 epochs at 2048; 10 warm-up epochs from 0, cosine to 1/1000 of the peak), the
iteration counts written in their comments, the expander (8192-8192-8192, BatchNorm and
ReLU after the first two Linear layers, no bias on the last), the coefficients, LARS
without weight decay or trust ratio on 1-D parameters; one training step on a fake
batch fits end to end."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from vissl.losses.build import build_loss
from vissl.losses.vicreg_loss import VICRegLoss
from vissl.models import build_model
from vissl.optimizers import build_optimizer
from vissl.optimizers.lars import LARS
from vissl.optimizers.param_scheduler import build_param_schedulers
from vissl.utils.hydra_config import hydra_compose_and_validate

IMAGENET_TRAIN_IMAGES = 1281167
ROOT = "pretrain/vicreg/"

# config -> (GPUs, batch per GPU, iterations per epoch in its comments, lr per 256
#            images, epochs)
CONFIGS = {
    "vicreg_8gpu_resnet": (8, 64, 2502, 0.3, 100),
    "vicreg_64gpu_resnet": (64, 32, 625, 0.2, 1000),
}
PEAKS = {  # written out: the arithmetic the configs' comments state
    "vicreg_8gpu_resnet": 0.6,  # 0.3 x 512 / 256
    "vicreg_64gpu_resnet": 1.6,  # 0.2 x 2048 / 256
}
WARMUP_EPOCHS = 10


def _compose(name: str, *overrides: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the shipped configs must not warn
        _, cfg = hydra_compose_and_validate([f"config={name}", *overrides])
    return cfg


def _world_size(cfg) -> int:
    return int(cfg.DISTRIBUTED.NUM_NODES) * int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)


def _build(cfg):
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    loss = build_loss(cfg.LOSS, cfg)
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


def _leaf_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in module.modules() if not list(m.children())]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_builds_with_consistent_numbers(name: str, one_thread) -> None:
    gpus, batch, iterations, per_256, epochs = CONFIGS[name]
    cfg = _compose(ROOT + name)
    assert _world_size(cfg) == gpus
    assert int(cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA) == batch
    assert cfg.DATA.TRAIN.DATASET_NAMES == ["imagenet1k_folder"]
    assert cfg.DATA.TRAIN.DROP_LAST
    assert int(cfg.OPTIMIZER.num_epochs) == epochs
    model, loss, schedules, optimizer = _build(cfg)

    # the lr: linear in the global batch, warm-up from 0, cosine to 1/1000 of the peak
    assert isinstance(optimizer, LARS)
    peak = per_256 * gpus * batch / 256
    assert peak == pytest.approx(PEAKS[name])
    assert cfg.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.base_value == pytest.approx(per_256)
    assert not cfg.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.auto_scale
    warmup = WARMUP_EPOCHS / epochs
    assert schedules.values(0.0)["lr"] == 0.0
    assert schedules.values(warmup / 2)["lr"] == pytest.approx(peak / 2, rel=1e-6)
    assert schedules.values(warmup)["lr"] == pytest.approx(peak, rel=1e-6)
    end = peak * 0.001
    middle = warmup + (1 - warmup) / 2  # halfway down the cosine: the mean of its ends
    assert schedules.values(middle)["lr"] == pytest.approx((peak + end) / 2, rel=1e-3)
    assert schedules.values(1.0)["lr"] == pytest.approx(end, rel=1e-6)

    # the iteration counts in the comments: what the sampler and DROP_LAST give
    assert math.ceil(IMAGENET_TRAIN_IMAGES / gpus) // batch == iterations

    # the loss: the paper's coefficients, the expander's width
    assert isinstance(loss, VICRegLoss)
    assert (loss.sim_coeff, loss.std_coeff, loss.cov_coeff) == (25.0, 25.0, 1.0)
    assert (loss.eps, loss.embedding_dim) == (1e-4, 8192)

    # the expander: Linear-BN-ReLU, Linear-BN-ReLU, Linear (no bias on the last one)
    layers = _leaf_layers(model.heads)
    kinds = [type(m).__name__ for m in layers]
    assert kinds == ["Linear", "BatchNorm1d", "ReLU"] * 2 + ["Linear"]
    linears = [m for m in layers if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (2048, 8192),
        (8192, 8192),
        (8192, 8192),
    ]
    assert [m.bias is not None for m in linears] == [True, True, False]
    assert cfg.MODEL.TRUNK.RESNETS.DEPTH == 50 and cfg.MODEL.TRUNK.RESNETS.ZERO_INIT_RESIDUAL
    assert cfg.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN

    # LARS as the VICReg code: eta 0.001, weight decay 1e-6, 1-D parameters excluded
    assert optimizer.defaults["exclude_bias_and_norm"]
    assert optimizer.defaults["eta"] == pytest.approx(0.001)
    assert cfg.OPTIMIZER.weight_decay == pytest.approx(1e-6)
    grouped = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert len(grouped) == sum(1 for _ in model.parameters())

    # two asymmetric views: blur p 1.0 / 0.1, solarize p 0.0 / 0.2
    transforms = cfg.DATA.TRAIN.TRANSFORMS
    assert transforms[0].name == "ImgReplicatePil" and transforms[0].num_times == 2
    probs = [list(t.prob) for t in transforms if t.name == "ImgPilMultiCropRandomApply"]
    assert probs == [[1.0, 0.1], [0.0, 0.2]]


@pytest.mark.slow
def test_one_training_step_on_a_fake_batch(one_thread) -> None:
    """ResNet-50 with the 8192-wide expander on 4 samples x 2 views of 32 px: the loss and
    its terms are finite, and a LARS step at the peak rate moves the trunk and the
    expander."""
    torch.manual_seed(0)
    cfg = _compose(ROOT + "vicreg_8gpu_resnet")
    model, loss, schedules, optimizer = _build(cfg)
    model.train()
    schedules.apply(optimizer, WARMUP_EPOCHS / 100, None)
    x = torch.randn(8, 3, 32, 32)
    watched = ["trunk._feature_blocks.conv1.weight", "heads.0.clf.0.weight", "heads.2.clf.0.weight"]
    params = dict(model.named_parameters())
    before = {n: params[n].detach().clone() for n in watched}
    out = loss(model(x))
    optimizer.zero_grad()
    out["loss"].backward()
    optimizer.step()
    value = float(out["loss"].detach())
    assert math.isfinite(value) and value > 0
    assert 0 <= float(out["variance"]) < 1
    assert all(not torch.equal(params[n], before[n]) for n in watched)


@pytest.mark.parametrize("name", ["test/integration_test/quick_vicreg", "digits/vicreg"])
def test_quick_and_digits_configs_build(name: str) -> None:
    cfg = _compose(name)
    model, loss, _, optimizer = _build(cfg)
    assert isinstance(loss, VICRegLoss) and isinstance(optimizer, LARS)
    assert loss.embedding_dim == int(cfg.MODEL.HEAD.PARAMS[-1][1]["dims"][-1])
    kinds = [type(m).__name__ for m in _leaf_layers(model.heads)]
    assert kinds == ["Linear", "BatchNorm1d", "ReLU"] * 2 + ["Linear"]

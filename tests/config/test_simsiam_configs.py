"""The SimSiam ImageNet configs build the model as simsiam/builder.py does: a ResNet-50
with zero-init residuals, a 3-layer projector without biases whose output goes through a
BatchNorm without affine (and no ReLU), and the bottleneck predictor 2048-512-2048."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from vissl.models import build_model
from vissl.utils.hydra_config import hydra_compose_and_validate


def layout(head: nn.Module) -> list[str]:
    """A head's layers in order: ``Linear`` (``+b`` with a bias), ``BN`` (``BN-`` without
    affine), ``ReLU``."""
    names = []
    for m in head.modules():
        if isinstance(m, nn.Linear):
            names.append("Linear+b" if m.bias is not None else "Linear")
        elif isinstance(m, nn.BatchNorm1d):
            names.append("BN" if m.affine else "BN-")
        elif isinstance(m, nn.ReLU):
            names.append("ReLU")
    return names


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("gpus", [8, 64])
def test_model_is_built_as_the_authors_build_it(gpus: int, one_thread) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the shipped configs must not warn
        _, cfg = hydra_compose_and_validate([f"config=pretrain/simsiam/simsiam_{gpus}gpu_resnet50"])
    assert cfg.MODEL.TRUNK.RESNETS.ZERO_INIT_RESIDUAL is True
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    # zero_init_residual: the last BatchNorm of each of ResNet-50's 16 blocks starts at 0
    zeroed = [
        m for m in model.trunk.modules() if isinstance(m, nn.BatchNorm2d) and not m.weight.any()
    ]
    assert len(zeroed) == 16
    projector, predictor = model.heads
    hidden = ["Linear", "BN", "ReLU"]
    # SimSiam's projector: its last Linear's bias is frozen (requires_grad False) and
    # cancelled by the BN after it; here it has none
    assert layout(projector) == [*hidden, *hidden, "Linear", "BN-"]
    assert isinstance(projector.clf[-1], nn.BatchNorm1d)
    assert projector.clf[-1].num_features == 2048
    # the predictor's first Linear has no bias, its last Linear one, as SimSiam's
    assert layout(predictor) == ["Linear", "BN", "ReLU", "Linear+b"]
    linears = [m for m in predictor.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(2048, 512), (512, 2048)]

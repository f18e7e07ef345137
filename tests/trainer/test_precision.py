"""Precision strategies chosen from MODEL.AMP_PARAMS."""

from __future__ import annotations

import pytest
import torch

from vissl.errors import ConfigError
from vissl.trainer.precision import (
    AutocastPrecision,
    GradScalerPrecision,
    Precision,
    build_precision,
)

CPU = torch.device("cpu")


def test_fp32_by_default():
    p = build_precision({"USE_AMP": False}, CPU)
    assert type(p) is Precision and p.amp_type is None and p.state_dict() == {}


def test_bf16_autocast_on_cpu():
    p = build_precision({"USE_AMP": True, "AMP_TYPE": "pytorch", "AMP_DTYPE": "bfloat16"}, CPU)
    assert isinstance(p, AutocastPrecision) and p.name == "bf16"
    lin = torch.nn.Linear(4, 4)
    with p.autocast():
        out = lin(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16


def test_fp16_on_cpu_falls_back_to_bf16_with_warning():
    with pytest.warns(UserWarning, match="bfloat16"):
        p = build_precision({"USE_AMP": True, "AMP_TYPE": "pytorch", "AMP_DTYPE": "float16"}, CPU)
    assert p.name == "bf16"


def test_apex_maps_to_torch_amp_with_warning():
    with pytest.warns(UserWarning, match="apex"):
        p = build_precision({"USE_AMP": True, "AMP_TYPE": "apex", "AMP_DTYPE": "bfloat16"}, CPU)
    assert isinstance(p, AutocastPrecision)


def test_bad_amp_type_names_key():
    with pytest.raises(ConfigError, match="config.MODEL.AMP_PARAMS.AMP_TYPE"):
        build_precision({"USE_AMP": True, "AMP_TYPE": "o2"}, CPU)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp16_grad_scaler_on_cuda_round_trips_state():
    p = build_precision(
        {"USE_AMP": True, "AMP_TYPE": "pytorch", "AMP_DTYPE": "float16"}, torch.device("cuda")
    )
    assert isinstance(p, GradScalerPrecision)
    model = torch.nn.Linear(4, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with p.autocast():
        loss = model(torch.randn(8, 4, device="cuda")).float().mean()
    p.backward(loss)
    p.step(opt)
    state = p.state_dict()
    q = build_precision(
        {"USE_AMP": True, "AMP_TYPE": "pytorch", "AMP_DTYPE": "float16"}, torch.device("cuda")
    )
    q.load_state_dict(state)
    assert q.grad_scaler.get_scale() == p.grad_scaler.get_scale()

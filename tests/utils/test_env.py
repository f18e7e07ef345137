"""MACHINE.ALLOW_TF32, MACHINE.CUDNN_BENCHMARK and REPRODUCIBILITY.CUDDN_DETERMINISTIC
reach torch's CUDA backend switches (#22 item 12)."""

from __future__ import annotations

import pytest
import torch

from vissl.config.attr_dict import AttrDict
from vissl.utils.env import apply_cuda_backend_settings


@pytest.fixture(autouse=True)
def _restore_backends():
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )
    yield
    (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    ) = saved


def _cfg(tf32: bool, benchmark: bool, deterministic: bool) -> AttrDict:
    return AttrDict(
        {
            "MACHINE": {"DEVICE": "gpu", "ALLOW_TF32": tf32, "CUDNN_BENCHMARK": benchmark},
            "REPRODUCIBILITY": {"CUDDN_DETERMINISTIC": deterministic},
        }
    )


@pytest.mark.parametrize("tf32", [True, False])
def test_tf32_and_benchmark_follow_the_config(tf32: bool) -> None:
    apply_cuda_backend_settings(_cfg(tf32, benchmark=True, deterministic=False))
    assert torch.backends.cuda.matmul.allow_tf32 is tf32
    assert torch.backends.cudnn.allow_tf32 is tf32
    assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic


def test_deterministic_turns_benchmark_off() -> None:
    apply_cuda_backend_settings(_cfg(True, benchmark=True, deterministic=True))
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


def test_the_keys_are_in_the_defaults() -> None:
    from vissl.utils.hydra_config import hydra_compose_and_validate

    _, cfg = hydra_compose_and_validate(
        [
            "config=quick_start",
            "config.MACHINE.ALLOW_TF32=False",
            "config.MACHINE.CUDNN_BENCHMARK=False",
        ]
    )
    assert cfg.MACHINE.ALLOW_TF32 is False and cfg.MACHINE.CUDNN_BENCHMARK is False

"""Monitoring hooks from HOOKS keys: model complexity, GPU stats, memory summary and dump."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.hooks import default_hook_generator
from vissl.hooks.monitoring_hooks import (
    DumpMemoryOnException,
    LogGpuMemoryHook,
    LogGpuStatsHook,
    ModelComplexityHook,
)
from vissl.hooks.tensorboard_hook import SSLTensorboardHook
from vissl.utils.hydra_config import hydra_compose_and_validate


def _cfg(tmp_path: Any, *overrides: str) -> Any:
    _, cfg = hydra_compose_and_validate(
        ["config=quick_start", f"config.CHECKPOINT.DIR={tmp_path}", *overrides]
    )
    return cfg


def _task(model: nn.Module, device: str = "cpu", **extra: Any) -> SimpleNamespace:
    return SimpleNamespace(
        base_model=model,
        model=model,
        device=torch.device(device),
        train=True,
        is_log_iteration=True,
        **extra,
    )


def test_model_complexity_counts_flops_of_a_known_model(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
    model.train()
    hook = ModelComplexityHook([3, 8, 8])
    with caplog.at_level(logging.INFO, logger="vissl.hooks.monitoring_hooks"):
        hook.on_start(_task(model))
    conv = 8 * 8 * 8 * 3 * 3 * 3  # output positions x channels x kernel (multiply-adds)
    assert hook.result["flops"] >= conv
    assert hook.result["params"] == 8 * 3 * 3 * 3 + 2 * 8
    assert model.training  # train mode restored
    assert model[1].num_batches_tracked.item() == 0  # ran in eval mode
    assert "GFLOPs" in caplog.text and "parameters" in caplog.text


def test_model_complexity_from_config_on_a_tiny_resnet(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from vissl.models import build_model

    cfg = _cfg(
        tmp_path,
        "config.HOOKS.MODEL_COMPLEXITY.COMPUTE_COMPLEXITY=true",
        "config.HOOKS.MODEL_COMPLEXITY.INPUT_SHAPE=[3,32,32]",
        "config.MODEL.TRUNK.RESNETS.DEPTH=18",
        "config.MODEL.TRUNK.RESNETS.SMALL_IMAGE_STEM=false",
        "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=1.0",
        "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[512,10]}]]",
    )
    (hook,) = [h for h in default_hook_generator(cfg) if isinstance(h, ModelComplexityHook)]
    model = build_model(cfg.MODEL, cfg.OPTIMIZER)
    wrapped = torch.compile(model, backend="eager")  # the hook looks through wrappers
    with caplog.at_level(logging.INFO, logger="vissl.hooks.monitoring_hooks"):
        hook.on_start(SimpleNamespace(base_model=None, model=wrapped, device=torch.device("cpu")))
    # ResNet-18 is 1.82 GFLOPs at 224x224; at 32x32 about (32/224)^2 of that.
    assert 2e7 < hook.result["flops"] < 6e7
    assert hook.result["params"] == sum(p.numel() for p in model.parameters())
    assert "model complexity at input [1, 3, 32, 32]" in caplog.text


def test_model_complexity_failure_only_warns(caplog: pytest.LogCaptureFixture) -> None:
    hook = ModelComplexityHook([5])  # a Conv2d cannot take this input
    with caplog.at_level(logging.WARNING, logger="vissl.hooks.monitoring_hooks"):
        hook.on_start(_task(nn.Conv2d(3, 4, 3)))
    assert hook.result["flops"] == -1
    assert "INPUT_SHAPE" in caplog.text


@pytest.mark.parametrize("shape", [[], [3, 0, 4], "3x224x224", [3, True]])
def test_bad_input_shape_names_the_key(shape: Any) -> None:
    with pytest.raises(ConfigError, match="HOOKS.MODEL_COMPLEXITY.INPUT_SHAPE"):
        ModelComplexityHook(shape)


def test_gpu_hooks_are_no_ops_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    task = _task(nn.Linear(2, 2))
    stats, memory = LogGpuStatsHook(), LogGpuMemoryHook(0)
    with caplog.at_level(logging.INFO, logger="vissl.hooks.monitoring_hooks"):
        stats.on_start(task)
        for _ in range(3):
            stats.on_step(task)
            memory.on_step(task)
    assert not stats.enabled and memory.done
    assert caplog.text == ""


def test_memory_summary_waits_for_its_iteration() -> None:
    hook = LogGpuMemoryHook(2)
    task = _task(nn.Linear(2, 2))
    hook.on_step(task)
    hook.on_step(task)
    assert not hook.done
    hook.on_step(task)
    assert hook.done
    with pytest.raises(ConfigError, match="LOG_ITERATION_NUM"):
        LogGpuMemoryHook(-1)


def test_hooks_from_config(tmp_path: Any) -> None:
    def kinds(*overrides: str) -> set[type]:
        return {type(h) for h in default_hook_generator(_cfg(tmp_path, *overrides))}

    cpu = kinds("config.MACHINE.DEVICE=cpu")
    assert not cpu & {LogGpuStatsHook, LogGpuMemoryHook, ModelComplexityHook}
    gpu = kinds("config.MACHINE.DEVICE=gpu")
    assert {LogGpuStatsHook, LogGpuMemoryHook} <= gpu
    off = kinds(
        "config.MACHINE.DEVICE=gpu",
        "config.HOOKS.LOG_GPU_STATS=false",
        "config.HOOKS.MEMORY_SUMMARY.PRINT_MEMORY_SUMMARY=false",
    )
    assert not off & {LogGpuStatsHook, LogGpuMemoryHook}
    assert DumpMemoryOnException in kinds(
        "config.HOOKS.MEMORY_SUMMARY.DUMP_MEMORY_ON_EXCEPTION=true"
    )


def test_dump_memory_on_exception_writes_live_tensors(tmp_path: Any) -> None:
    hook = DumpMemoryOnException(str(tmp_path))
    keep = torch.zeros(123, 7)
    hook.on_exception(_task(nn.Linear(2, 2)))
    assert hook.path == os.path.join(str(tmp_path), "memory_dump_rank0.txt")
    with open(hook.path, encoding="utf-8") as f:
        text = f.read()
    assert text.startswith("live tensors:")
    assert "cpu float32 [123, 7]" in text
    del keep


@pytest.mark.parametrize("value", ["null", "''"])
def test_tensorboard_null_experiment_dir_is_the_default_folder(tmp_path: Any, value: str) -> None:
    cfg = _cfg(
        tmp_path,
        "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=true",
        f"config.HOOKS.TENSORBOARD_SETUP.EXPERIMENT_LOG_DIR={value}",
        "config.HOOKS.TENSORBOARD_SETUP.LOG_DIR=null",
    )
    (tb,) = [h for h in default_hook_generator(cfg) if isinstance(h, SSLTensorboardHook)]
    assert tb.log_dir == os.path.join(str(tmp_path), "tensorboard")

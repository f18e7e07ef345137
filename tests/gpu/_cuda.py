"""Shared pieces of the CUDA suite: overrides, a crash-and-resume run, a sync count."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration._runs import run_config
from tests.integration.test_exact_resume import assert_same, crash_generator, final_weights
from vissl.hooks import default_hook_generator

CUDA = ["config.MACHINE.DEVICE=gpu", "config.DISTRIBUTED.BACKEND=nccl"]
PRECISION_BF16 = [
    "config.MODEL.AMP_PARAMS.USE_AMP=True",
    "config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16",
]
PRECISION_FP16 = [
    "config.MODEL.AMP_PARAMS.USE_AMP=True",
    "config.MODEL.AMP_PARAMS.AMP_DTYPE=float16",
]


def crash_and_resume_bitwise(config: str, tmp_path: Any, crash_at: int, *overrides: str) -> None:
    """Train uninterrupted; train again, crashing after ``crash_at``; resume; the final
    weights must be bitwise equal (deterministic cudnn)."""
    common = [
        *CUDA,
        *overrides,
        "config.REPRODUCIBILITY.CUDDN_DETERMINISTIC=True",
        "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3",
        "config.CHECKPOINT.AUTO_RESUME=True",
    ]
    run_config(config, *common, f"config.CHECKPOINT.DIR={tmp_path / 'full'}")
    crashed = tmp_path / "crashed"
    with pytest.raises(Exception, match="simulated crash"):
        run_config(
            config,
            *common,
            f"config.CHECKPOINT.DIR={crashed}",
            hook_generator=crash_generator(crash_at),
        )
    run_config(config, *common, f"config.CHECKPOINT.DIR={crashed}")
    assert_same(final_weights(tmp_path / "full"), final_weights(crashed))


def syncs_between_log_steps(config: str, tmp_path: Any, *overrides: str) -> list[tuple]:
    """Train ``config`` on CUDA with a single log step; the steps with host syncs, as
    (iteration, count, messages)."""
    from tests.gpu.test_cuda_host_syncs import SyncCounter

    counter = SyncCounter()
    run_config(
        config,
        *CUDA,
        *overrides,
        "config.LOG_FREQUENCY=1000",
        f"config.CHECKPOINT.DIR={tmp_path}",
        hook_generator=lambda cfg: [*default_hook_generator(cfg), counter],
    )
    quiet = [(it, n, s) for it, log, n, s in counter.per_step if not log]
    assert quiet, "no step between log steps"
    return [(it, n, s) for it, n, s in quiet if n]

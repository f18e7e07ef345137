"""Host syncs per step on CUDA, counted with ``torch.cuda.set_sync_debug_mode``: none
between log steps."""

from __future__ import annotations

import warnings

import pytest
import torch

from vissl.hooks import VisslHook

CUDA = ["config.MACHINE.DEVICE=gpu", "config.DISTRIBUTED.BACKEND=nccl"]
PRECISION_BF16 = [
    "config.MODEL.AMP_PARAMS.USE_AMP=True",
    "config.MODEL.AMP_PARAMS.AMP_DTYPE=bfloat16",
]
PRECISION_FP16 = [
    "config.MODEL.AMP_PARAMS.USE_AMP=True",
    "config.MODEL.AMP_PARAMS.AMP_DTYPE=float16",
]


class SyncCounter(VisslHook):
    """Counts the synchronizing CUDA calls made between two ``on_step`` events."""

    priority = 10_000  # last

    def __init__(self) -> None:
        self.per_step: list[tuple[int, bool, int, list[str]]] = []
        self._catcher = None
        self._log = None

    def _start(self) -> None:
        self._catcher = warnings.catch_warnings(record=True)
        self._log = self._catcher.__enter__()
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")

    def _stop(self) -> list[str]:
        torch.cuda.set_sync_debug_mode(0)
        log = self._log or []
        self._catcher.__exit__(None, None, None)
        self._catcher = None
        return [str(w.message)[:200] for w in log if "synchroniz" in str(w.message)]

    def on_phase_start(self, task) -> None:
        self._start()

    def on_step(self, task) -> None:
        syncs = self._stop()
        self.per_step.append((task.iteration, task.is_log_iteration, len(syncs), syncs))
        self._start()

    def on_phase_end(self, task) -> None:
        if self._catcher is not None:
            self._stop()

    def on_exception(self, task) -> None:
        if self._catcher is not None:
            self._stop()


@pytest.mark.parametrize(
    "config,extra",
    [
        ("test/integration_test/quick_moco", []),
        ("test/integration_test/quick_dino", []),
        ("test/integration_test/quick_swav", []),
        ("test/integration_test/quick_barlow_twins", []),
        ("test/integration_test/quick_simclr_multicrop", []),
        ("test/integration_test/quick_moco", PRECISION_BF16),
        ("test/integration_test/quick_dino_vit", PRECISION_BF16),
        ("test/integration_test/quick_moco", ["config.HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True"]),
    ],
)
def test_no_host_sync_between_log_steps(tmp_path, config, extra) -> None:
    bad = syncs_between_log_steps(config, tmp_path, *extra)
    assert not bad, f"host syncs between log steps: {bad[:3]}"


@pytest.mark.parametrize(
    "config",
    ["test/integration_test/quick_moco", "test/integration_test/quick_dino"],  # sgd, adamw
)
def test_fp16_with_fused_optimizers_has_no_host_sync(tmp_path, config) -> None:
    """torch's GradScaler reads its found-inf flag back to decide whether to step a
    non-fused optimizer; sgd/adam/adamw are fused on CUDA, so a skipped step is decided
    on the device."""
    bad = syncs_between_log_steps(config, tmp_path, *PRECISION_FP16)
    assert not bad, f"host syncs between log steps: {bad[:3]}"

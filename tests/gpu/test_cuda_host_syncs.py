"""Host syncs per step on CUDA, counted with ``torch.cuda.set_sync_debug_mode``: none
between log steps."""

from __future__ import annotations

import pytest

from tests.gpu._cuda import PRECISION_BF16, PRECISION_FP16, syncs_between_log_steps


@pytest.mark.parametrize(
    "config,extra",
    [
        ("test/integration_test/quick_moco", []),
        ("test/integration_test/quick_dino", []),
        ("test/integration_test/quick_swav", []),
        ("test/integration_test/quick_barlow_twins", []),
        ("test/integration_test/quick_simclr_multicrop", []),
        ("test/integration_test/quick_byol", []),
        ("test/integration_test/quick_simsiam", []),
        ("test/integration_test/quick_moco_v3", []),
        ("test/integration_test/quick_vicreg", []),
        ("test/integration_test/quick_nnclr", []),
        ("test/integration_test/quick_moco", PRECISION_BF16),
        ("test/integration_test/quick_dino_vit", PRECISION_BF16),
        ("test/integration_test/quick_moco", ["config.HOOKS.EMA_MODEL.SAVE_EMA_MODEL=True"]),
        # GradClipHook's per-parameter and per-module norms stay on the device
        ("test/integration_test/quick_dino_vit", ["config.MODEL.GRAD_CLIP.MODE=per_parameter"]),
        ("test/integration_test/quick_dinov2", ["config.MODEL.GRAD_CLIP.MODE=per_module"]),
        ("test/integration_test/quick_msn", ["config.MODEL.GRAD_CLIP.EXCLUDE_PARAMS=[prototypes]"]),
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

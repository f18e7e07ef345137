"""``MODEL.GRAD_CLIP.MODE`` per_parameter and per_module under FSDP2 end to end: quick_dino
on 2 gloo processes, sharded, ends with the weights of the same run under DDP (each
sharded gradient clipped by its whole norm, not by a rank's slice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration._runs import run_config
from tests.integration.test_fsdp import DINO, FSDP, TINY, TWO, assert_close, final_state


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)  # four 2-process runs
@pytest.mark.parametrize("mode", ["per_parameter", "per_module"])
def test_fsdp_clipping_modes_equal_ddp(tmp_path: Path, mode: str) -> None:
    # a max norm below the gradients' norms, so that clipping acts on most tensors
    clip = [f"config.MODEL.GRAD_CLIP.MODE={mode}", "config.MODEL.GRAD_CLIP.MAX_NORM=0.01"]
    run_config(DINO, TWO, *TINY, *clip, f"config.CHECKPOINT.DIR={tmp_path / 'ddp'}")
    run_config(DINO, TWO, *TINY, *clip, FSDP, f"config.CHECKPOINT.DIR={tmp_path / 'fsdp'}")
    assert "GradClipHook" in (tmp_path / "fsdp" / "log.txt").read_text()
    assert_close(final_state(tmp_path / "ddp"), final_state(tmp_path / "fsdp"), atol=1e-4)

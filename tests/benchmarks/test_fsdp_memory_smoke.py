"""Smoke test of benchmarks/fsdp_memory.py: 2 gloo processes, ViT-Ti; the sharded state
per rank is half of DDP's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.benchmarks._load import REPO


# two spawned pairs of processes (each re-imports torch): behind `slow`
@pytest.mark.slow
def test_fsdp_halves_the_state_per_rank_on_two_processes(tmp_path) -> None:
    out = tmp_path / "rows.json"
    script = os.path.join(REPO, "benchmarks", "fsdp_memory.py")
    args = ["--nprocs", "2", "--model", "vit_tiny", "--json", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| 2 | fsdp |" in proc.stdout
    rows = {r["mode"]: r for r in json.loads(out.read_text())}
    assert rows["ddp"]["vs_ddp"] == 1.0
    # every parameter's rows split over 2 ranks: half, up to one row per odd-sized tensor
    assert 0.49 < rows["fsdp"]["vs_ddp"] < 0.52
    assert rows["fsdp"]["optimizer"] < 0.52 * rows["ddp"]["optimizer"]

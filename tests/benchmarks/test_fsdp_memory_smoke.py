"""Smoke test of benchmarks/fsdp_memory.py: 2 gloo processes, ViT-Ti; the sharded state
per rank is half of DDP's."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks._load import load_benchmark


# two spawned pairs of processes (each re-imports torch): behind `slow`
@pytest.mark.slow
def test_fsdp_halves_the_state_per_rank_on_two_processes(tmp_path) -> None:
    bench = load_benchmark("fsdp_memory.py")
    out = tmp_path / "rows.json"
    assert bench.main(["--nprocs", "2", "--model", "vit_tiny", "--json", str(out)]) == 0
    rows = {r["mode"]: r for r in json.loads(out.read_text())}
    assert rows["ddp"]["vs_ddp"] == 1.0
    # every parameter's rows split over 2 ranks: half, up to one row per odd-sized tensor
    assert 0.49 < rows["fsdp"]["vs_ddp"] < 0.52
    assert rows["fsdp"]["optimizer"] < 0.52 * rows["ddp"]["optimizer"]

"""Smoke test of benchmarks/phase_start_wait.py: it runs both variants and prints its table
and last line (no timing checks)."""

from __future__ import annotations

import re
from types import ModuleType

import pytest

from tests.benchmarks._load import load_benchmark
from vissl.trainer.trainer_main import SelfSupervisionTrainer


def _load() -> ModuleType:
    return load_benchmark("phase_start_wait.py")


@pytest.mark.slow
def test_benchmark_measures_every_boundary_of_both_variants(capsys):
    prefetch = SelfSupervisionTrainer._prefetch_next_phase
    bench = _load()
    argv = ["--rounds", "1", "--epochs", "3", "--steps", "1", "--batch-size", "2"]
    result = bench.main([*argv, "--workers", "1", "--quiet"])
    lines = capsys.readouterr().out.strip().splitlines()
    # 3 epochs: two boundaries per run, measured for each variant
    for variant in bench.VARIANTS:
        assert len(result["results"][variant]["wait"]) == 2
        assert len(result["results"][variant]["boundary"]) == 2
        assert all(w >= 0 for w in result["results"][variant]["wait"])
        assert any(line.startswith(variant) for line in lines)
    assert re.fullmatch(r"phase_start_wait: wait \d+ -> \d+ ms per phase \(median\)", lines[-1])
    # the run restores what it patched
    assert SelfSupervisionTrainer._prefetch_next_phase is prefetch

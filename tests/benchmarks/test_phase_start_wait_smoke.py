"""Smoke test of benchmarks/phase_start_wait.py: it runs both variants and prints its table
and last line (no timing checks)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from types import ModuleType

from vissl.trainer.trainer_main import SelfSupervisionTrainer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "phase_start_wait.py")


def _load() -> ModuleType:
    name = "vissl_benchmark_phase_start_wait"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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

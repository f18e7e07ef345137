"""Smoke test of benchmarks/train_step_overhead.py: it runs and prints its table (no timing checks)."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "train_step_overhead.py")


def _load() -> ModuleType:
    name = "vissl_benchmark_train_step_overhead"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_benchmark_prints_the_table(capsys):
    bench = _load()
    result = bench.main(
        [
            "--steps", "3",
            "--warmup", "1",
            "--rounds", "1",
            "--batch-size", "2",
            "--image-size", "16",
            "--width-multiplier", "0.125",
            "--log-frequency", "2",
            "--threads", "1",
            "--quiet",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "train_step_overhead: resnet18 (width x0.125) @ 16px, batch 2, 3 timed steps" in out
    for label in bench.LABELS.values():
        assert label in out
    assert "ratio b/a:" in out and "ratio c/b:" in out
    assert "device reads per step (a)" in out and "device reads per step (b)" in out
    # the same model, batches and seed on every side: the same arithmetic
    losses = {v: runs[-1].final_loss for v, runs in result["results"].items()}
    assert losses["a"] == losses["b"] == losses["c"]
    # a loss read on each logged step in the window (iterations 2 and 4 of 2..4)
    assert result["reads"]["a"].counts["item"] == 2
    assert result["reads"]["b"].counts["item"] >= 1

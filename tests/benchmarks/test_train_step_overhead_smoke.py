"""Smoke test of benchmarks/train_step_overhead.py: it runs and prints its table (no timing
checks), for the ResNet and for the tiny model."""

from __future__ import annotations

import re
from types import ModuleType

import pytest

from tests.benchmarks._load import load_benchmark


def _load() -> ModuleType:
    return load_benchmark("train_step_overhead.py")


@pytest.mark.slow
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
    # the trainer too: one read per logged step, shared by the NaN check and the log line
    assert sum(result["reads"]["b"].counts.values()) == 2


def test_tiny_mode_reports_the_added_ms_per_step(capsys):
    bench = _load()
    result = bench.main(
        ["--model", "tiny", "--steps", "20", "--warmup", "2", "--rounds", "2", "--threads", "1",
         "--quiet", "--no-count"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "train_step_overhead: tiny @ 8px, batch 8, 20 timed steps after 2 warm-up" in out
    assert "added by the trainer (b - a): " in out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"train_step_overhead: added -?\d+\.\d{3} ms/step \(b/a \d+\.\d{4}\)", last)
    added = result["added"]
    runs = result["results"]
    diffs = sorted(1000 * (b.seconds - a.seconds) / 20 for a, b in zip(runs["a"], runs["b"]))
    assert added["wall_ms"] == pytest.approx(sum(diffs) / 2)  # the median of two rounds
    assert f"added {added['wall_ms']:.3f} ms/step" in last
    # the tiny trunk is built by vissl's model builder on both sides: the same arithmetic
    losses = {v: r[-1].final_loss for v, r in runs.items()}
    assert losses["a"] == losses["b"] == losses["c"]


def test_tiny_mode_rejects_a_width_multiplier():
    bench = _load()
    with pytest.raises(SystemExit):
        bench.parse_args(["--model", "tiny", "--width-multiplier", "0.5"])

"""Smoke test of benchmarks/online_knn_cost.py: --tiny runs both variants and the offline
tool, prints its table and last line, and the online top-1 of the last phase is the
offline tool's on the same checkpoint and subsets (no timing checks)."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks._load import load_benchmark


@pytest.mark.slow
def test_tiny_run_compares_both_variants_and_the_offline_knn(capsys):
    bench = load_benchmark("online_knn_cost.py")
    result = bench.main(["--tiny", "--offline", "--quiet", "--threads", "1"])
    summary = result["summary"]
    lines = capsys.readouterr().out.strip().splitlines()
    for variant in bench.VARIANTS:
        assert len(result["results"][variant]) == 1
        assert any(line.startswith(f"round 0 {variant}") for line in lines)
    assert result["results"]["without"][0]["monitor_s"] == 0.0
    assert result["results"]["with_knn"][0]["monitor_s"] > 0.0
    assert len(summary["online_top_1"]) == 2  # one value per phase
    assert summary["online_top_1"][-1] == pytest.approx(summary["offline_top_1"], abs=0.5)
    assert re.fullmatch(
        r"online_knn_cost: [+-]\d+\.\d% wall time \(median of 1\), monitor \d+\.\d% of the "
        r"run; online top-1 \d+\.\d\d, offline \d+\.\d\d",
        lines[-1],
    )

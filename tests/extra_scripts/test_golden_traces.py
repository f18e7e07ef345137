"""The quick configs' golden traces (tests/golden/quick_traces.json, recorded on main
d5d5a94 by ``extra_scripts/golden_traces.py record``) still hold: the first 20 logged
losses and the final weights' checksums of every quick config are bitwise what they were
before the method-layer redesign (#36)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "extra_scripts" / "golden_traces.py"
GOLDEN = REPO / "tests" / "golden" / "quick_traces.json"


def test_every_quick_config_has_a_trace() -> None:
    configs = json.loads(GOLDEN.read_text(encoding="utf-8"))["configs"]
    quick = {p.stem for p in (REPO / "configs/config/test/integration_test").glob("quick_*.yaml")}
    assert set(configs) == quick | {"quick_start"}
    for name, trace in configs.items():
        assert trace["losses"] and set(trace["checksums"]) == {"model", "loss"}, name


def test_an_unknown_config_is_a_one_line_error() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "check", "--golden", str(GOLDEN), "--only", "quick_dinoo"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: unknown quick configs ['quick_dinoo']")


@pytest.mark.slow
def test_the_quick_configs_train_as_recorded() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "check", "--golden", str(GOLDEN)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]

"""Smoke test of benchmarks/scaling.py under ``--start-method spawn`` (no timing checks).

Spawned workers re-import the script: the timer's settings must reach them in the pickled
hook generator, not through module state (which they would see at its default).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys

import pytest

from tests.benchmarks._load import REPO, load_benchmark


def test_hook_generator_carries_its_settings_through_pickle():
    bench = load_benchmark("scaling.py")
    hooks = bench.TimedHooks(warmup=3, global_batch=8, out="/tmp/x.json")
    # what a spawned worker gets: the settings, not a reference to module state
    assert pickle.loads(pickle.dumps(hooks)) == hooks


# minutes under spawn (each worker re-imports torch): behind `slow`; the settings
# travelling through pickle, the spawn fix, is checked above
@pytest.mark.slow
def test_spawned_workers_report_images_per_second(tmp_path):
    out = tmp_path / "scaling.json"
    argv = [
        sys.executable,
        os.path.join(REPO, "benchmarks", "scaling.py"),
        "--start-method", "spawn",
        "--nprocs", "1", "2",
        "--repeats", "1",
        "--steps", "2",
        "--warmup", "1",
        "--batch-per-rank", "2",
        "--image-size", "16",
        "--model-width", "0.125",
        "--no-independent",
        "--json", str(out),
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "spawn workers" in proc.stdout
    for n in (1, 2):
        assert re.search(rf"run 1/1, {n} process\(es\): \d+\.\d images/s", proc.stdout)
        assert re.search(rf"^\| {n} x 1 \| \d+\.\d \|", proc.stdout, re.MULTILINE)
    result = json.loads(out.read_text())
    assert result["start_method"] == "spawn"
    assert set(result["median_images_per_s"]) == {"1", "2"}
    assert all(v > 0 for v in result["median_images_per_s"].values())

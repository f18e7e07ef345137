"""Smoke test of benchmarks/gpu_report.py: ``--tiny --device cpu`` runs all three workloads
through vissl's trainer and the hand loop and prints the table (no timing checks)."""

from __future__ import annotations

import json
import re
from types import ModuleType

import pytest

from tests.benchmarks._load import load_benchmark


def _load() -> ModuleType:
    return load_benchmark("gpu_report.py")


# about 90 s on 2 cores: behind `slow` (the report is a GPU benchmark)
@pytest.mark.slow
def test_tiny_report_has_every_row_with_positive_figures(capsys, tmp_path):
    bench = _load()
    out_json = tmp_path / "report.json"
    argv = ["--tiny", "--device", "cpu", "--rounds", "1", "--steps", "2", "--warmup", "1",
            "--workers", "1", "--quiet", "--json", str(out_json)]  # fmt: skip
    result = bench.main(argv)
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    # a progress line per round and variant
    for name in bench.WORKLOADS:
        for label in ("vissl", "hand loop"):
            assert re.search(rf"\] {name} round 1/1 {label}: \d+\.\d images/s", out)
    header = next(line for line in lines if line.startswith("gpu_report: CPU"))
    assert "bf16 autocast" in header and "simclr 4 / dino 4 / barlow 4" in header
    assert "| workload | variant | images/s per GPU | trainer/hand ratio |" in out
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 6
    titles = ("SimCLR ResNet-18 x0.25", "DINO ViT", "Barlow Twins ViT")
    for title in titles:
        for label in ("vissl", "hand loop"):
            row = next(r for r in rows if r.startswith(f"| {title}") and f"| {label} |" in r)
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert float(cells[2]) > 0  # images/s
            assert float(cells[3]) > 0  # ratio
            assert cells[4] == "n/a" and cells[5] == "n/a"  # peak memory, syncs: CUDA only
    assert "device augmentation" in out
    assert bench.ANCHOR in out
    assert re.fullmatch(
        r"gpu_report: simclr vissl/hand \d+\.\d{3}, dino vissl/hand \d+\.\d{3}, "
        r"barlow vissl/hand \d+\.\d{3}",
        lines[-1],
    )
    # the same model, batches, seed and device tail on both sides: the same arithmetic
    for r in result["results"]:
        assert r.runs["vissl"][-1].final_loss == r.runs["hand"][-1].final_loss, r.name
    report = json.loads(out_json.read_text())
    assert set(report["workloads"]) == set(bench.WORKLOADS)
    assert all(w["vissl"]["median_images_per_s"] > 0 for w in report["workloads"].values())


def test_batch_sizes_per_workload():
    bench = _load()
    args = bench.parse_args(["--device", "cpu", "--batch-size", "dino=32", "barlow=8"])
    assert args.batch == {"simclr": 128, "dino": 32, "barlow": 8}
    assert bench.parse_args(["--device", "cpu", "--batch-size", "16"]).batch == dict.fromkeys(
        bench.WORKLOADS, 16
    )
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--batch-size", "swav=8"])


def test_hydra_value_writes_nested_overrides():
    bench = _load()
    value = [{"name": "ImgPilGaussianBlur", "p": 0.5, "radius": [0.1, 2.0], "x": None}]
    assert bench.hydra_value(value) == (
        "[{name: ImgPilGaussianBlur, p: 0.5, radius: [0.1, 2.0], x: null}]"
    )
    assert bench.hydra_value(True) == "true" and bench.hydra_value("a b") == "'a b'"

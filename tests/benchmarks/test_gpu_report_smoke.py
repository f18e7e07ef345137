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


# about 4 min on 2 cores: behind `slow` (the report is a GPU benchmark)
@pytest.mark.slow
def test_tiny_report_has_every_row_with_positive_figures(capsys, tmp_path):
    bench = _load()
    out_json = tmp_path / "report.json"
    argv = ["--tiny", "--device", "cpu", "--rounds", "2", "--steps", "2", "--warmup", "1",
            "--workers", "1", "--quiet", "--json", str(out_json)]  # fmt: skip
    result = bench.main(argv)
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    # a progress line per round and variant, in the rotating order
    for name in bench.WORKLOADS:
        for label in ("vissl", "hand loop", "hand loop (A/A)"):
            for r in (1, 2):
                assert re.search(
                    rf"\] {name} round {r}/2 {re.escape(label)}: \d+\.\d images/s", out
                )
    assert bench.round_order(0) != bench.round_order(1)
    header = next(line for line in lines if line.startswith("gpu_report: CPU"))
    assert "bf16 autocast" in header and "simclr 4 / dino 4 / barlow 4 / mae 4 / ibot 4" in header
    assert "| workload | variant | images/s per GPU | spread (min-max) |" in out
    rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 3 * len(bench.WORKLOADS)
    titles = ("SimCLR ResNet-18 x0.25", "DINO ViT", "Barlow Twins ViT", "MAE ViT", "iBOT ViT")
    for title in titles:
        for label in ("vissl", "hand loop", "hand loop (A/A)"):
            row = next(r for r in rows if r.startswith(f"| {title}") and f"| {label} |" in r)
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert float(cells[2]) > 0  # images/s
            assert float(cells[4].split()[0]) > 0  # ratio
            assert float(cells[5]) > 0 and float(cells[6]) > 0  # wall, host ms/step
            assert cells[7] == "n/a" and cells[8] == "n/a"  # peak memory, syncs: CUDA only
    assert "device augmentation" in out
    assert bench.ANCHOR in out
    assert re.search(r"samples/s of barlow as stable-pretraining counts them: vissl \d", out)
    assert bench.SPT_CONVENTION in out
    for name in bench.WORKLOADS:
        assert re.search(rf"verdict, {name}: (within the noise floor|vissl (slower|faster))", out)
    assert re.fullmatch(
        r"gpu_report: "
        + ", ".join(
            rf"{n} vissl/hand \d+\.\d{{3}} \(floor \d+\.\d{{3}}\)" for n in bench.WORKLOADS
        ),
        lines[-1],
    )
    # the same model, batches, seed and device tail on every side: the same arithmetic
    # (DINO and iBOT: the same per-parameter clipping as the recipe's GradClipHook)
    for r in result["results"]:
        losses = {v: r.runs[v][-1].final_loss for v in bench.VARIANTS}
        assert len(set(losses.values())) == 1, (r.name, losses)
    report = json.loads(out_json.read_text())
    assert set(report["workloads"]) == set(bench.WORKLOADS)
    assert all(w["vissl"]["median_images_per_s"] > 0 for w in report["workloads"].values())
    assert report["workloads"]["barlow"]["spt_samples_per_s"]["hand"] > 0


def test_the_verdict_needs_a_gap_outside_the_noise_floor():
    bench = _load()
    m = bench.Measurement

    def result(vissl: list[float], hand: list[float], aa: list[float]):
        runs = {
            "vissl": [m(seconds=1 / x) for x in vissl],
            "hand": [m(seconds=1 / x) for x in hand],
            "hand_aa": [m(seconds=1 / x) for x in aa],
        }
        return bench.WorkloadResult("dino", "DINO", 1, runs, {})

    noisy = result([95, 97, 99, 96, 98], [100] * 5, [96, 104, 100, 101, 99])
    assert noisy.floor(1) == pytest.approx(0.04)
    assert noisy.verdict(1).startswith("within the noise floor")
    slow = result([90, 91, 92, 90, 91], [100] * 5, [99, 101, 100, 100, 100])
    assert slow.verdict(1).startswith("vissl slower than the hand loop by 9.0%")


def test_batch_sizes_per_workload():
    bench = _load()
    args = bench.parse_args(["--device", "cpu", "--batch-size", "dino=32", "barlow=8"])
    assert args.batch == {"simclr": 128, "dino": 32, "barlow": 8, "mae": 256, "ibot": 64}
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

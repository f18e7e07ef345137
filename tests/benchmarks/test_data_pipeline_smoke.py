"""Smoke test of benchmarks/data_pipeline.py: it runs and prints its table (no timing checks)."""

from __future__ import annotations

import importlib
import os
import re
from types import ModuleType

import pytest

from tests.benchmarks._load import REPO, load_benchmark


def _load() -> ModuleType:
    return load_benchmark("data_pipeline.py")


@pytest.mark.slow
def test_benchmark_prints_the_table_and_the_ratio_last(capsys):
    bench = _load()
    result = bench.main(["--num-images", "2", "--rounds", "1", "--quiet"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("data_pipeline: 2 JPEGs")
    for chain in ("simclr (2x224)", "swav (2x224 + 6x96)", "dino (2x224 + 10x96)"):
        rows = [line for line in lines if line.startswith(f"| {chain} |")]
        assert len(rows) == len(bench.VARIANTS) == 4, lines
        for label, row in zip(bench.LABELS.values(), rows):
            assert label in row
        tail = next(line for line in lines if line.startswith(f"{chain}: the colour tail"))
        assert re.search(r"on cpu, batched: \d+\.\d\d ms/sample$", tail)
    assert re.fullmatch(r"data_pipeline: default/baseline \d+\.\d\dx", lines[-1])
    simclr = next(r for r in result["results"] if r.chain == "simclr")
    assert lines[-1] == f"data_pipeline: default/baseline {result['ratio']:.2f}x"
    assert result["ratio"] == bench.ratio_to_baseline(simclr, "default")
    assert all(len(s) == 1 for s in simclr.seconds.values())


def test_the_baseline_mirrors_the_configs_transform_lists():
    bench = _load()
    import yaml

    path = os.path.join(REPO, "configs", "config", "pretrain", "dino", "dino_8gpu_vits16.yaml")
    with open(path) as f:
        entries = yaml.safe_load(f)["config"]["DATA"]["TRAIN"]["TRANSFORMS"]
    views = bench.plain_views(entries)
    assert len(views) == 12
    sizes = [v.transforms[0].size for v in views]
    assert sizes == [(224, 224)] * 2 + [(96, 96)] * 10
    # crop, flip, colour, then the two ImgPilMultiCropRandomApply: blur and solarize
    blur_probs = [v.transforms[3].p for v in views]
    assert blur_probs == [1.0, 0.1] + [0.5] * 10
    solarize_probs = [v.transforms[4].p for v in views]
    assert solarize_probs == [0.0, 0.2] + [0.0] * 10
    jitter = views[0].transforms[2].transforms[0].transforms[0]
    assert (jitter.brightness, jitter.saturation, jitter.hue) == (
        (0.6, 1.4),
        (0.8, 1.2),
        (-0.1, 0.1),
    )


def test_images_look_like_imagenet_jpegs(tmp_path):
    bench = _load()
    paths = bench.make_image_folder(str(tmp_path), 3)
    from PIL import Image

    for path in paths:
        with Image.open(path) as image:
            width, height = image.size
            assert image.format == "JPEG" and image.mode == "RGB"
        bytes_per_pixel = os.path.getsize(path) / (width * height)
        assert 0.2 < bytes_per_pixel < 1.5  # photo-like, not flat and not pure noise


@pytest.mark.slow
def test_benchmark_through_data_loader_workers(capsys, monkeypatch):
    # imported under its own name from sys.path, so that the workers (forkserver) can
    # unpickle the baseline's dataset class
    monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
    bench = importlib.import_module("data_pipeline")
    bench.main(["--chain", "simclr", "--num-images", "4", "--rounds", "2", "--workers", "1"])
    out = capsys.readouterr().out
    assert "samples/s per worker (1 workers)" in out

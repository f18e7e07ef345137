"""The "From Python" examples of docs/evaluation.md that use ``vissl.evaluation.knn`` run,
and print what the page says: the raw-pixel top-1 of its comment, and, on a folder of
extracted features, the top-1 that ``tools/nearest_neighbor_test.py`` prints for it."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import numpy as np
import pytest

from tests.tools._fixtures import (
    call_main,
    drop_vissl_log_handlers,  # noqa: F401 (autouse)
)
from vissl.evaluation.benchmarks import nearest_neighbor

REPO = Path(__file__).resolve().parents[2]
FOLDER = "checkpoints/nn_digits_quick_start"  # the folder the page's example reads
TOP1 = re.compile(r"top-1 (\d+\.\d\d)%")


def _knn_blocks() -> list[str]:
    text = (REPO / "docs" / "evaluation.md").read_text(encoding="utf-8")
    section = text.split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    found = [b for b in blocks if "from vissl.evaluation.knn import" in b]
    assert len(found) == 2, (
        "docs/evaluation.md 'From Python' lost its vissl.evaluation.knn examples"
    )
    return found


def _run(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/evaluation.md", "exec"), {"__name__": "__docs__"})
    return out.getvalue()


def test_raw_pixel_knn_prints_the_top1_of_its_comment() -> None:
    block = next(b for b in _knn_blocks() if "load_digits" in b)
    documented = re.search(r"# top-1 (\d+\.\d\d)%", block)
    assert documented is not None
    printed = TOP1.search(_run(block))
    assert printed is not None and printed.group(1) == documented.group(1)


@pytest.mark.slow  # extracts features twice (~1 min on 2 cores)
def test_features_knn_prints_the_top1_of_the_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    block = next(b for b in _knn_blocks() if "load_split_features" in b)
    folder = tmp_path / FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(4, 16))
    for split, n in (("train", 120), ("test", 40)):
        targets = rng.integers(0, 4, n)
        features = centers[targets] + 1.5 * rng.normal(size=(n, 16))  # overlapping classes
        stem = folder / f"rank0_chunk0_{split}_trunk"
        np.save(f"{stem}_features.npy", features.astype(np.float32))
        np.save(f"{stem}_targets.npy", targets[:, None].astype(np.int64))
        np.save(f"{stem}_inds.npy", np.arange(n))
    rc, out, err = call_main(
        capsys,
        "nearest_neighbor_test",
        nearest_neighbor.main,
        "config=benchmark/nearest_neighbor/digits/nn_digits_quick_start",
        f"config.NEAREST_NEIGHBOR.FEATURES.PATH={folder}",
        f"config.CHECKPOINT.DIR={tmp_path / 'knn'}",
    )
    assert rc == 0, err
    tool_top1 = TOP1.search(out.strip().splitlines()[-1])
    assert tool_top1 is not None and 0 < float(tool_top1.group(1)) < 100  # a check that can fail
    monkeypatch.chdir(tmp_path)
    printed = TOP1.search(_run(block))
    assert printed is not None and printed.group(1) == tool_top1.group(1)
    assert os.getcwd() == str(tmp_path)

"""tools/train_svm_low_shot.py (VISSL's VOC07 low-shot SVMs) on features written here:
the draws, the per-draw mAP (scikit-learn SVMs and AP written here) and the aggregation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import precision_recall_curve
from sklearn.svm import LinearSVC

from tests.integration._runs import REPO
from vissl.errors import ConfigError
from vissl.evaluation.benchmarks import svm_low_shot as tool
from vissl.evaluation.cli import run_tool

TOOL = os.path.join(REPO, "tools", "train_svm_low_shot.py")
COSTS = [0.1, 1.0]
KS = [1, 3]
DRAWS = [1, 2]


def _write_split(folder: Path, split: str, n: int, rng: np.random.Generator) -> tuple:
    """VOC-like (n, 4) targets (1 / 0 / -1) and 16-d features that carry the classes."""
    targets = rng.choice([1, 0, 0, -1], size=(n, 4), p=[0.35, 0.25, 0.3, 0.1]).astype(np.int64)
    feats = rng.normal(size=(n, 16)) + 1.5 * np.pad(targets == 1, ((0, 0), (0, 12)))
    stem = folder / f"rank0_chunk0_{split}_trunk"
    np.save(f"{stem}_features.npy", feats.astype(np.float32))
    np.save(f"{stem}_targets.npy", targets)
    np.save(f"{stem}_inds.npy", np.arange(n))
    return feats, targets


def _ap(y: np.ndarray, s: np.ndarray) -> float:
    precision, recall, _ = precision_recall_curve(y, s)
    return float(np.sum((recall[:-1] - recall[1:]) * np.maximum.accumulate(precision)[:-1]))


def test_low_shot_svms_against_sklearn(tmp_path: Path, capsys) -> None:
    feats_dir = tmp_path / "features"
    feats_dir.mkdir()
    rng = np.random.default_rng(0)
    train_x, train_y = _write_split(feats_dir, "train", 60, rng)
    test_x, test_y = _write_split(feats_dir, "test", 40, rng)
    out = tmp_path / "run"
    args = [
        "config=benchmark/svm/digits/svm_digits_quick_start",
        f"config.SVM.FEATURES.PATH={feats_dir}",
        f"config.SVM.costs.costs_list=[{COSTS[0]},{COSTS[1]}]",
        f"config.SVM.low_shot.k_values=[{KS[0]},{KS[1]}]",
        f"config.SVM.low_shot.sample_inds=[{DRAWS[0]},{DRAWS[1]}]",
        f"config.CHECKPOINT.DIR={out}",
    ]
    capsys.readouterr()
    assert run_tool("train_svm_low_shot", tool.main, args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("svm_low_shot: k=3 mAP mean ") and lines[-1].endswith("layer=trunk")
    layer_dir = out / "svm_low_shot_trunk"

    def unit(x: np.ndarray) -> np.ndarray:
        return x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-5)

    per_draw = np.zeros((len(KS), len(DRAWS), len(COSTS)))
    for i, k in enumerate(KS):
        for j, draw in enumerate(DRAWS):
            drawn = np.load(layer_dir / f"trunk_sample{draw}_k{k}.npy")
            # k positives and 3 k negatives per class, taken from the real labels
            assert ((drawn == 1).sum(0) == k).all() and ((drawn == 0).sum(0) == 3 * k).all()
            assert (train_y[drawn == 1] == 1).all() and (train_y[drawn == 0] == 0).all()
            for c_idx, cost in enumerate(COSTS):
                aps = []
                for c in range(4):
                    rows = drawn[:, c] != -1
                    svm = LinearSVC(
                        C=cost, class_weight={1: 2.0, -1: 1.0}, tol=1e-4, random_state=0
                    ).fit(unit(train_x)[rows], np.where(drawn[rows, c] == 1, 1, -1))
                    counted = test_y[:, c] != -1
                    scores = svm.decision_function(unit(test_x)[counted])
                    aps.append(_ap(test_y[counted, c] == 1, scores))
                per_draw[i, j, c_idx] = np.mean(aps)
            saved = np.load(layer_dir / f"test_ap_sample{draw}_k{k}.npy")
            assert saved[0] == pytest.approx(per_draw[i, j], abs=1e-6)
    # the two draws differ (independent samples)
    assert not np.array_equal(
        np.load(layer_dir / "trunk_sample1_k1.npy"), np.load(layer_dir / "trunk_sample2_k1.npy")
    )
    results = json.loads((out / "svm_low_shot_results.json").read_text())["trunk"]
    mean = per_draw.mean(axis=1)
    for i, k in enumerate(KS):
        best = int(np.argmax(mean[i]))
        expected = {
            "mean": round(100 * mean[i, best], 2),
            "min": round(100 * per_draw[i, :, best].min(), 2),
            "max": round(100 * per_draw[i, :, best].max(), 2),
            "std": round(100 * per_draw[i, :, best].std(), 2),
        }
        assert results[f"k={k}"] == pytest.approx(expected, abs=0.011)

    with pytest.raises(ConfigError, match="k=30 needs 30 positives"):
        tool.main([*args, "config.SVM.low_shot.k_values=[30]"])
    with pytest.raises(ConfigError, match="dataset_name='places205'"):
        tool.main([*args, "config.SVM.low_shot.dataset_name=places205"])

"""tools/extract_feature_and_rank.py: extraction, then nearest-neighbour ranking checked
against a brute-force search written here."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.integration._runs import REPO
from vissl.errors import ConfigError
from vissl.evaluation.benchmarks import ranking as tool
from vissl.evaluation.cli import run_tool

TOOL = os.path.join(REPO, "tools", "extract_feature_and_rank.py")


@pytest.mark.integration
def test_extract_and_rank_images(tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(12):
        path = tmp_path / "img" / f"{i:02d}.png"
        path.parent.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    np.save(tmp_path / "images.npy", np.array(paths))
    out = tmp_path / "run"
    args = [
        "config=digits/clusterfit_features",
        "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
        "config.DATA.TRAIN.DATA_SOURCES=[disk_filelist]",
        f"config.DATA.TRAIN.DATA_PATHS=[{tmp_path / 'images.npy'}]",
        "config.DATA.TEST.DATA_LIMIT=8",
        f"config.CHECKPOINT.DIR={out}",
        "config.RANKING.FEATURES.DATASET_NAME=tiny",
    ]
    capsys.readouterr()
    assert run_tool("extract_feature_and_rank", tool.main, args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("extract_feature_and_rank: 12 train samples ranked (layer trunk")
    with open(out / "ranking_tiny_train_faiss.pkl", "rb") as f:
        ranking = pickle.load(f)

    # brute force on the extracted features: L2-normalise, nearest other sample
    feats = np.load(out / "rank0_chunk0_train_trunk_features.npy").astype(np.float64)
    inds = np.load(out / "rank0_chunk0_train_trunk_inds.npy")
    feats = feats[np.argsort(inds)].reshape(12, -1)
    feats = feats / (np.linalg.norm(feats, axis=1, keepdims=True) + 1e-5)
    nearest = [
        min(float(((feats[i] - feats[j]) ** 2).sum()) for j in range(12) if j != i)
        for i in range(12)
    ]
    order = sorted(range(12), key=lambda i: -nearest[i])
    assert ranking["indices"] == order
    assert ranking["img_paths"] == [paths[i] for i in order]
    assert ranking["distances"] == pytest.approx([nearest[i] for i in order], rel=1e-4)

    with pytest.raises(ConfigError, match="RANKING.RANKING_BACKEND"):
        tool.main([*args, "config.RANKING.RANKING_BACKEND=annoy"])

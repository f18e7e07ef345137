"""tools/instance_retrieval_test.py on a fake Revisited Oxford tree (gnd pickle written
here): the mAP of the Easy / Medium / Hard setups equals a hand computation, and the
similarities equal descriptors computed here (resize, trunk, L2, scikit-learn's PCA
whitening); the protocol, R-MAC regions and GeM against hand-worked numbers."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.decomposition import PCA as SkPCA
from torchvision.transforms.functional import normalize, to_tensor

from tests.integration._runs import REPO
from vissl.errors import ConfigError
from vissl.evaluation.benchmarks import retrieval as tool
from vissl.evaluation.cli import run_tool
from vissl.models import build_model
from vissl.utils.hydra_config import hydra_compose_and_validate

TOOL = os.path.join(REPO, "tools", "instance_retrieval_test.py")
CONFIG = "config=benchmark/instance_retrieval/eval_resnet_1gpu_roxford"
S = 32  # RESIZE_IMG
SIZES = [(30, 40), (40, 28), (36, 36), (24, 44)]
# 3 queries over 12 database images; query 2 has no easy image (left out of E's mean)
GND = [
    {"easy": [0, 1], "hard": [2], "junk": [3], "bbx": [2.0, 3.0, 20.0, 25.0]},
    {"easy": [4], "hard": [5, 6], "junk": [], "bbx": [0.0, 0.0, 30.0, 20.0]},
    {"easy": [], "hard": [7], "junk": [8, 9], "bbx": [5.0, 5.0, 25.0, 25.0]},
]


def _write_set(root: Path, name: str, n_db: int, queries: int, gnd: list[dict], seed: int) -> None:
    rng = np.random.default_rng(seed)
    folder = root / name / "jpg"
    folder.mkdir(parents=True)
    imlist = [f"{name}_db_{i:02d}" for i in range(n_db)]
    qimlist = [f"{name}_q_{i}" for i in range(queries)]
    base = rng.uniform(0, 255, (48, 48, 3))
    for k, stem in enumerate(imlist + qimlist):
        h, w = SIZES[k % len(SIZES)]
        # images share a base pattern more or less: similarities that differ
        mix = rng.uniform(0, 1)
        pixels = mix * base[:h, :w] + (1 - mix) * rng.uniform(0, 255, (h, w, 3))
        Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{stem}.jpg", quality=95)
    entries = [
        {
            "easy": np.asarray(g["easy"], dtype=np.int64),
            "hard": np.asarray(g["hard"], dtype=np.int64),
            "junk": np.asarray(g["junk"], dtype=np.int64),
            "bbx": g["bbx"],
        }
        for g in gnd
    ]
    with open(root / name / f"gnd_{name}.pkl", "wb") as f:
        pickle.dump({"imlist": imlist, "qimlist": qimlist, "gnd": entries}, f)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("retrieval")
    _write_set(root, "roxford5k", 12, 3, GND, seed=0)
    _write_set(root, "rparis6k", 10, 1, [{"easy": [0], "hard": [], "junk": [], "bbx": []}], 1)
    return root


def _overrides(root: Path, out: Path, weights: Path, *extra: str) -> list[str]:
    return [
        CONFIG,
        "config.MODEL.TRUNK.RESNETS.DEPTH=18",
        "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={weights}",
        f"config.IMG_RETRIEVAL.DATASET_PATH={root}",
        f"config.IMG_RETRIEVAL.RESIZE_IMG={S}",
        "config.MACHINE.DEVICE=cpu",
        f"config.CHECKPOINT.DIR={out}",
        *extra,
    ]


def _weights(path: Path, overrides: list[str]) -> torch.nn.Module:
    """A seeded model of the config, saved as a vissl checkpoint; returns it."""
    _, cfg = hydra_compose_and_validate(overrides)
    torch.manual_seed(0)
    model = build_model(cfg.MODEL, cfg.OPTIMIZER).eval()
    trunk = {
        k.removeprefix("trunk."): v for k, v in model.state_dict().items() if k.startswith("trunk.")
    }
    torch.save(
        {"classy_state_dict": {"base_model": {"model": {"trunk": trunk, "heads": {}}}}}, path
    )
    return model


def _hand_ap(order: list[int], positives: set[int], ignored: set[int]) -> float:
    """Walk down the ranking without the ignored images; each positive adds the mean of the
    precision just before and just after it, times a recall step of 1 / #positives."""
    kept = [i for i in order if i not in ignored]
    hits, ap = 0, 0.0
    for rank, image in enumerate(kept):
        if image in positives:
            before = hits / rank if rank else 1.0
            hits += 1
            ap += (before + hits / (rank + 1)) / 2 / len(positives)
    return ap


def _hand_maps(sim: np.ndarray) -> dict[str, float]:
    setups = {
        "e": (("easy",), ("junk", "hard")),
        "m": (("easy", "hard"), ("junk",)),
        "h": (("hard",), ("junk", "easy")),
    }
    maps = {}
    for setup, (pos_keys, ign_keys) in setups.items():
        aps = []
        for q, g in enumerate(GND):
            positives = {i for k in pos_keys for i in g[k]}
            if not positives:
                continue
            order = sorted(range(sim.shape[1]), key=lambda i: -sim[q, i])
            aps.append(_hand_ap(order, positives, {i for k in ign_keys for i in g[k]}))
        maps[setup] = float(np.mean(aps))
    return maps


def _descriptor(model: torch.nn.Module, path: Path) -> np.ndarray:
    img = Image.open(path).convert("RGB")
    w, h = img.size
    ratio = S / max(h, w)
    img = img.resize((round(w * ratio), round(h * ratio)), Image.BILINEAR)
    x = normalize(to_tensor(img), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    with torch.no_grad():
        feats = model(x[None])[0].reshape(1, -1).double()
    return (feats / (feats.norm() + 1e-6)).numpy()


def test_fake_roxford_mean_ap_equals_hand_computation(tmp_path: Path, tree: Path, capsys) -> None:
    """Default descriptor path (the pooled map, L2, PCA whitening on rparis6k, cosine)."""
    extra = [
        "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[res5avg,[Identity,[]]]]",
        "config.IMG_RETRIEVAL.FEATS_PROCESSING_TYPE=''",
        "config.IMG_RETRIEVAL.N_PCA=6",
    ]
    weights = tmp_path / "weights.torch"
    model = _weights(weights, _overrides(tree, tmp_path, weights, *extra))
    out = tmp_path / "run"
    capsys.readouterr()
    rc = run_tool("instance_retrieval_test", tool.main, _overrides(tree, out, weights, *extra))
    printed = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    assert printed[-1].startswith("instance_retrieval: roxford5k mAP E ")
    assert printed[-1].endswith("queries=3 database=12")

    metrics = json.loads((out / "metrics.json").read_text())
    sim = np.asarray(json.loads((out / "similarity_scores.json").read_text())).T  # (q, db)
    ranks = json.loads((out / "rankings.json").read_text())
    assert sim.shape == (3, 12) and len(ranks) == 3
    assert all(r == sorted(range(12), key=lambda i: -row[i]) for r, row in zip(ranks, sim))

    # the descriptors, computed here: scikit-learn's whitening is vissl's (VISSL's) times
    # sqrt(n - 1) (covariance vs scatter matrix) up to a sign per component
    train = np.concatenate(
        [_descriptor(model, p) for p in sorted((tree / "rparis6k" / "jpg").glob("*_db_*.jpg"))]
    )
    pca = SkPCA(n_components=6, whiten=True, svd_solver="full").fit(train)
    jpg = tree / "roxford5k" / "jpg"
    queries = pca.transform(
        np.concatenate([_descriptor(model, jpg / f"roxford5k_q_{i}.jpg") for i in range(3)])
    )
    database = pca.transform(
        np.concatenate([_descriptor(model, jpg / f"roxford5k_db_{i:02d}.jpg") for i in range(12)])
    )
    expected_sim = queries @ database.T / (len(train) - 1)
    assert np.allclose(sim, expected_sim, rtol=1e-3, atol=1e-4)

    hand = _hand_maps(expected_sim)
    assert metrics["mAP"] == pytest.approx(hand, abs=1e-9)
    assert metrics["mp@k"]["k"] == [1, 5, 10]
    assert 0 < hand["m"] < 1  # neither perfect nor empty: the check can fail


def test_user_errors(tmp_path: Path, tree: Path) -> None:
    base = _overrides(tree, tmp_path, Path(""))

    def error(*extra: str) -> str:
        with pytest.raises(ConfigError) as info:
            tool.main([*base, *extra])
        return str(info.value)

    assert "EVAL_DATASET_NAME='Oxford'" in error("config.IMG_RETRIEVAL.EVAL_DATASET_NAME=Oxford")
    assert "TRAIN_PCA_WHITENING=True" in error("config.IMG_RETRIEVAL.TRAIN_PCA_WHITENING=False")
    assert "SIMILARITY_MEASURE='dot'" in error("config.IMG_RETRIEVAL.SIMILARITY_MEASURE=dot")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["rmac", "gem"])
def test_rmac_and_gem_paths(tmp_path: Path, tree: Path, capsys, kind: str) -> None:
    """R-MAC (PCA-whitened regions) and GeM (no whitening; descriptors checked here) on
    res5 maps: the reported mAP is the hand computation on the reported similarities."""
    extra = [
        "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[res5,[Identity,[]]]]",
        f"config.IMG_RETRIEVAL.FEATS_PROCESSING_TYPE={kind}",
        "config.IMG_RETRIEVAL.RESIZE_IMG=96",
        "config.IMG_RETRIEVAL.SPATIAL_LEVELS=2",
        "config.IMG_RETRIEVAL.N_PCA=16",
        "config.IMG_RETRIEVAL.GEM_POOL_POWER=3.0",
        f"config.IMG_RETRIEVAL.TRAIN_PCA_WHITENING={kind == 'rmac'}",
    ]
    weights = tmp_path / "weights.torch"
    model = _weights(weights, _overrides(tree, tmp_path, weights, *extra))
    out = tmp_path / "run"
    capsys.readouterr()
    rc = run_tool("instance_retrieval_test", tool.main, _overrides(tree, out, weights, *extra))
    assert rc == 0, capsys.readouterr().err
    metrics = json.loads((out / "metrics.json").read_text())
    sim = np.asarray(json.loads((out / "similarity_scores.json").read_text())).T
    assert metrics["mAP"] == pytest.approx(_hand_maps(sim), abs=1e-9)
    if kind == "gem":

        def descriptor(path: Path) -> np.ndarray:
            img = Image.open(path).convert("RGB")
            w, h = img.size
            img = img.resize((round(w * 96 / max(h, w)), round(h * 96 / max(h, w))), Image.BILINEAR)
            x = normalize(to_tensor(img), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
            with torch.no_grad():
                fmap = model(x[None])[0][0].double()  # (C, H, W)
            pooled = fmap.clamp(min=1e-6).pow(3).mean(dim=(1, 2)).pow(1 / 3)
            vec = torch.cat([pooled, torch.ones(1, dtype=torch.float64)])
            return (vec / (vec.norm() + 1e-6)).numpy()

        jpg = tree / "roxford5k" / "jpg"
        q = np.stack([descriptor(jpg / f"roxford5k_q_{i}.jpg") for i in range(3)])
        db = np.stack([descriptor(jpg / f"roxford5k_db_{i:02d}.jpg") for i in range(12)])
        assert np.allclose(sim, q @ db.T, atol=1e-5)

"""ClusterFit end to end: tools/cluster_features_and_label.py, then a classifier on its labels.

One command-line run extracts random-init trunk features of the digits and clusters them;
the other tests read its files (in this process). tools/cluster_assignments_to_dataset.py
is tested on assignment files written here, as the extract_cluster engine writes them.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image

from tests._cli import run_script
from tests.integration._runs import REPO
from vissl.engines.extract_features import ExtractedFeaturesLoader
from vissl.errors import VisslError
from vissl.evaluation.benchmarks import clustering as tool
from vissl.evaluation.benchmarks.cluster_assignments import assignments_to_dataset
from vissl.evaluation.cli import run_tool
from vissl.evaluation.clustering import l2_normalize
from vissl.utils.hydra_config import config_to_yaml, hydra_compose_and_validate

TOOL = os.path.join(REPO, "tools", "cluster_features_and_label.py")
TO_DATASET = os.path.join(REPO, "tools", "cluster_assignments_to_dataset.py")
RUN = os.path.join(REPO, "tools", "run_distributed_engines.py")
K = 10
STEP1 = [
    "config=digits/clusterfit_features",
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",  # 128 features
    f"config.CLUSTERFIT.NUM_CLUSTERS={K}",
    "config.CLUSTERFIT.NUM_ITER=100",
    "config.CLUSTERFIT.DATA_LIMIT=-1",
]

pytestmark = pytest.mark.integration


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")])
    return env


def run_cli(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_script(script, *args, cwd=cwd, env=_env())


@pytest.fixture(scope="module")
def step1(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("clusterfit")
    features, labels = root / "features", root / "labels"
    proc = run_cli(
        TOOL,
        *STEP1,
        f"config.CLUSTERFIT.FEATURES.PATH={features}",
        f"config.CLUSTERFIT.OUTPUT_DIR={labels}",
        f"config.CHECKPOINT.DIR={root / 'logs'}",
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": root, "features": features, "labels": labels, "stdout": proc.stdout}


def call_tool(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = run_tool("cluster_features_and_label", tool.main, list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_features_are_clustered_and_every_digit_gets_its_nearest_centroid(
    step1: dict[str, Any],
) -> None:
    lines = [ln for ln in step1["stdout"].splitlines() if ln.startswith("cluster_features")]
    assert len(lines) == 2 and " TRAIN 1438 samples" in lines[0] and " TEST 359 " in lines[1]
    folder = str(step1["features"])
    for split, n in (("train", 1438), ("test", 359)):
        stem = step1["labels"] / f"digits_{split}_trunk_N{K}_D128"
        labels = np.load(f"{stem}_labels.npy")
        assert labels.shape == (n,) and labels.dtype == np.int64
        assert not os.path.exists(f"{stem}_images.npy")  # digits are in memory: no paths
        with open(f"{stem}.pkl", "rb") as f:
            content = pickle.load(f)
        np.testing.assert_array_equal(content["hard_labels"], labels)
        np.testing.assert_array_equal(content["sample_indices"], np.arange(n))
        centroids = content["centroids"]
        assert centroids.shape == (K, 128)
        # independent of the tool: nearest centroid of the normalised features
        x = l2_normalize(ExtractedFeaturesLoader.load_features(folder, "trunk", split)["features"])
        sq = ((x[:, None, :].astype(np.float64) - centroids[None]) ** 2).sum(-1)
        np.testing.assert_array_equal(labels, sq.argmin(axis=1))
        if split == "train":
            # the centroids are k-means centroids of TRAIN: the mean of their members
            for k in range(K):
                np.testing.assert_allclose(centroids[k], x[labels == k].mean(0), atol=1e-4)
            assert len(np.unique(labels)) == K


@pytest.mark.slow
def test_step2_trains_a_fresh_trunk_on_the_cluster_labels(step1: dict[str, Any]) -> None:
    labels = step1["labels"]
    out = step1["root"] / "step2"
    proc = run_cli(
        RUN,
        "config=digits/clusterfit",
        "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
        f"config.MODEL.HEAD.PARAMS=[[mlp,{{dims:[128,{K}]}}]]",
        f"config.DATA.TRAIN.LABEL_PATHS=[{labels}/digits_train_trunk_N{K}_D128_labels.npy]",
        f"config.DATA.TEST.LABEL_PATHS=[{labels}/digits_test_trunk_N{K}_D128_labels.npy]",
        "config.OPTIMIZER.num_epochs=1",
        "config.TEST_EVERY_NUM_EPOCH=1",
        # a subset of the digits: the label files still cover them all
        "config.DATA.TRAIN.DATA_LIMIT=256",
        "config.DATA.TEST.DATA_LIMIT=128",
        "config.DATA.NUM_DATALOADER_WORKERS=0",
        f"config.CHECKPOINT.DIR={out}",
        cwd=step1["root"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "model_final_checkpoint_phase0.torch").exists()
    metrics = (out / "metrics.json").read_text()
    assert "test_accuracy_list_meter" in metrics


def test_reading_the_features_again_and_user_errors(
    step1: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [
        *STEP1,
        "config.CLUSTERFIT.FEATURES.EXTRACT=False",
        f"config.CLUSTERFIT.FEATURES.PATH={step1['features']}",
        f"config.CHECKPOINT.DIR={tmp_path / 'logs'}",
    ]
    rc, _, err = call_tool(
        capsys,
        *common,
        "config.CLUSTERFIT.NUM_CLUSTERS=5",
        "config.CLUSTERFIT.FEATURES.DIMENSIONALITY_REDUCTION=16",
        "config.CLUSTERFIT.FEATURES.TEST_PARTITION=''",
        "config.CLUSTERFIT.DATA_LIMIT=300",
        f"config.CLUSTERFIT.OUTPUT_DIR={tmp_path / 'pca'}",
    )
    assert rc == 0, err
    assert sorted(os.listdir(tmp_path / "pca")) == [
        "digits_train_trunk_N5_D16.pkl",
        "digits_train_trunk_N5_D16_labels.npy",
    ]
    cases = [
        ("config.CLUSTERFIT.FEATURES.LAYER_NAME=res5", "LAYER_NAME='res5': no TRAIN features"),
        ("config.CLUSTERFIT.NUM_CLUSTERS=5000", "NUM_CLUSTERS=5000 is more than the 1438"),
        ("config.CLUSTERFIT.CLUSTER_BACKEND=kmeans", "CLUSTER_BACKEND='kmeans'"),
        (
            "config.CLUSTERFIT.FEATURES.DIMENSIONALITY_REDUCTION=512",
            "DIMENSIONALITY_REDUCTION=512 is larger than the 128",
        ),
    ]
    for override, message in cases:
        rc, _, err = call_tool(
            capsys, *common, override, f"config.CLUSTERFIT.OUTPUT_DIR={tmp_path / 'x'}"
        )
        assert rc == 2 and message in err and err.count("\n") == 1, (override, err)
    assert not (tmp_path / "x").exists()


def _write_images(root: Path, n: int) -> None:
    for i in range(n):
        folder = root / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), (i * 20, 0, 0)).save(folder / f"img{i}.png")


def _assignments(folder: Path, split: str, assignments: np.ndarray, inds: np.ndarray) -> None:
    np.save(folder / f"{split}_cluster_assignments.npy", assignments)
    np.save(folder / f"{split}_cluster_inds.npy", inds)
    np.save(folder / f"{split}_cluster_targets.npy", np.zeros((len(inds), 1), np.int64))


def test_cluster_assignments_become_a_disk_filelist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = tmp_path / "images"
    _write_images(images, 6)
    _, cfg = hydra_compose_and_validate(
        [
            "config=quick_start",
            "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
            f"config.DATA.TRAIN.DATA_PATHS=[{images}]",
        ]
    )
    engine_out = tmp_path / "assign"
    engine_out.mkdir()
    (engine_out / "cluster_config.yaml").write_text(config_to_yaml(cfg))
    # two sets of prototypes; the engine writes samples in dataset-index order
    assignments = np.array([[3, 0], [1, 1], [3, 2], [0, 0], [2, 1], [1, 2]])
    _assignments(engine_out, "train", assignments, np.arange(6))
    out = tmp_path / "dataset"
    written = assignments_to_dataset(str(engine_out), str(out), head=1)
    assert written == [str(out / "train_images.npy"), str(out / "train_labels.npy")]
    paths = list(np.load(out / "train_images.npy"))
    expected = sorted(str(p) for p in images.rglob("*.png"))  # disk_folder's order
    assert [os.path.basename(p) for p in paths] == [os.path.basename(p) for p in expected]
    np.testing.assert_array_equal(np.load(out / "train_labels.npy"), assignments[:, 1])
    # the files are a data set vissl reads
    _, cfg2 = hydra_compose_and_validate(
        [
            "config=quick_start",
            "config.DATA.TRAIN.DATA_SOURCES=[disk_filelist]",
            f"config.DATA.TRAIN.DATA_PATHS=[{out}/train_images.npy]",
            "config.DATA.TRAIN.LABEL_SOURCES=[disk_filelist]",
            f"config.DATA.TRAIN.LABEL_PATHS=[{out}/train_labels.npy]",
        ]
    )
    from vissl.data import build_dataset

    ds = build_dataset(cfg2, "TRAIN")
    assert len(ds) == 6 and int(ds[4]["label"][0]) == assignments[4, 1]

    # user errors
    for args, message in (
        ((str(tmp_path / "nope"), str(out)), "no such folder"),
        ((str(engine_out), str(out), 2), "2 set(s) of prototypes"),
        ((str(images), str(out)), "no {train,test}_cluster_assignments.npy"),
    ):
        with pytest.raises(VisslError, match=re.escape(message)):
            assignments_to_dataset(*args)  # type: ignore[arg-type]
    # on the command line: one line, exit 2
    proc = run_script(TO_DATASET, "-i", str(engine_out), "-o", str(out), "--head", "2")
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.startswith("error: --head 2: ") and proc.stderr.count("\n") == 1


def test_in_memory_sources_get_labels_only_and_a_subset_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, cfg = hydra_compose_and_validate(["config=quick_start"])  # digits, in memory
    engine_out = tmp_path / "assign"
    engine_out.mkdir()
    with open(engine_out / "cluster_config.yaml", "w") as f:
        f.write(config_to_yaml(cfg))
    labels = np.arange(1438) % 7
    _assignments(engine_out, "train", labels[:, None], np.arange(1438))
    out = tmp_path / "dataset"
    assert assignments_to_dataset(str(engine_out), str(out)) == [str(out / "train_labels.npy")]
    assert sorted(os.listdir(out)) == ["train_labels.npy"]
    np.testing.assert_array_equal(np.load(out / "train_labels.npy"), labels)
    _assignments(engine_out, "train", labels[:10, None], np.arange(10))
    with pytest.raises(VisslError, match="cover 10 of its 1438 samples"):
        assignments_to_dataset(str(engine_out), str(out))
    # a config file that is not a vissl config
    (engine_out / "cluster_config.yaml").write_text(yaml.safe_dump({"a": 1}))
    with pytest.raises(VisslError, match="not a vissl config"):
        assignments_to_dataset(str(engine_out), str(out))

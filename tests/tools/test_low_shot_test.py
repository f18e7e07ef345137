"""tools/low_shot_test.py end to end on digits (random-init narrow ResNet-18 trunk).

One run is the real command line (extraction, then the draws); the others read its
features (``LOW_SHOT_BENCHMARK.FEATURES.PATH``) and call the tool's ``main`` in this
process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._cli import run_script
from tests.integration._runs import REPO
from vissl.engines.extract_features import ExtractedFeaturesLoader
from vissl.evaluation.benchmarks import low_shot as tool
from vissl.evaluation.cli import run_tool

TOOL = os.path.join(REPO, "tools", "low_shot_test.py")
CONFIG = "config=benchmark/low_shot_transfer/digits/low_shot_digits_quick_start"
SMALL = [
    CONFIG,
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",  # trunk output: 128 features
    "config.DATA.TRAIN.DATA_LIMIT=200",  # at least 10 digits of each class
    "config.DATA.TEST.DATA_LIMIT=100",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=64",
    "config.DATA.TEST.BATCHSIZE_PER_REPLICA=64",
    "config.LOW_SHOT_BENCHMARK.SAMPLES_PER_CLASS=[1,2,5,10]",
    "config.LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.SEEDS=[0,1,2]",
    "config.LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.LAMBDA=[1.0,0.1]",
]
PER_K = re.compile(r"k=(\d+) (\d+\.\d\d)±(\d+\.\d\d)%")
LINE = re.compile(
    r"^low_shot: top-1 ((?:k=\d+ \d+\.\d\d±\d+\.\d\d% )+)method=(\S+) seeds=(\d+) "
    r"layer=(\S+) train=(\d+) test=(\d+)$"
)

pytestmark = pytest.mark.integration


def call_tool(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the tool's ``main`` in this process as the command line would."""
    capsys.readouterr()
    rc = run_tool("low_shot_test", tool.main, list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    return run_script(TOOL, *args, cwd=REPO, env=env)


def per_k(line: str) -> dict[int, tuple[float, float]]:
    return {int(k): (float(m), float(s)) for k, m, s in PER_K.findall(line)}


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The real command line: extraction into CHECKPOINT.DIR, then the low-shot draws."""
    out = tmp_path_factory.mktemp("low_shot") / "run"
    proc = run_cli(*SMALL, f"config.CHECKPOINT.DIR={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": out, "stdout": proc.stdout, "stderr": proc.stderr}


def test_cli_prints_the_summary_last_and_writes_the_json(one_run: dict[str, Any]) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    last = one_run["stdout"].strip().splitlines()[-1]
    m = LINE.match(last)
    assert m, last
    assert m.groups()[1:] == ("logistic_regression", "3", "trunk", "200", "100")
    printed = per_k(m.group(1))
    assert list(printed) == [1, 2, 5, 10]
    assert "PARAMS_FILE is empty" in one_run["stderr"]  # random-init warning
    assert "Traceback" not in one_run["stderr"]

    folder: Path = one_run["dir"]
    report = json.loads((folder / "low_shot_results.json").read_text())
    assert report["benchmark"] == "low_shot" and report["method"] == "logistic_regression"
    assert report["samples_per_class"] == [1, 2, 5, 10] and report["seeds"] == [0, 1, 2]
    assert report["lambda"] == [1.0, 0.1] and report["svm_costs"] is None
    layer = report["layers"]["trunk"]
    assert (layer["train"], layer["test"]) == (200, 100)
    for r in layer["results"]:
        accs = np.array(r["accuracies"])
        assert len(accs) == 3 and r["seeds"] == [0, 1, 2]
        assert r["mean"] == pytest.approx(accs.mean()) and r["std"] == pytest.approx(accs.std())
        assert printed[r["k"]][0] == pytest.approx(r["mean"], abs=0.005)
        assert printed[r["k"]][1] == pytest.approx(r["std"], abs=0.005)
        assert all(lam in (1.0, 0.1) for lam in r["chosen"])
        assert "mean_ap" not in r
    by_k = {r["k"]: r for r in layer["results"]}
    assert by_k[1]["chosen"] == [1.0] * 3  # one sample per class: the first LAMBDA
    # more samples per class help, on average (random-init features of digits)
    assert 10.0 < by_k[1]["mean"] < by_k[10]["mean"] < 100.0

    # One draw again, independently: k=5 samples of each class (seed 2) from TRAIN,
    # standardised logistic regression with C = n / LAMBDA, top-1 on TEST.
    train = ExtractedFeaturesLoader.load_features(str(folder), "trunk", "train")
    test = ExtractedFeaturesLoader.load_features(str(folder), "trunk", "test")
    from vissl.evaluation.low_shot import sample_low_shot_indices

    idx = sample_low_shot_indices(train["targets"], 5, 2)
    assert np.bincount(train["targets"][idx]).tolist() == [5] * 10
    lam = by_k[5]["chosen"][2]
    scaler = StandardScaler().fit(train["features"][idx])
    clf = LogisticRegression(C=len(idx) / lam, max_iter=1000).fit(
        scaler.transform(train["features"][idx]), train["targets"][idx]
    )
    expected = 100 * (clf.predict(scaler.transform(test["features"])) == test["targets"]).mean()
    assert by_k[5]["accuracies"][2] == pytest.approx(expected)


def test_svm_method_on_the_extracted_features(
    one_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder: Path = one_run["dir"]
    stamp = {p.name: p.stat().st_mtime_ns for p in folder.glob("rank*.npy")}
    rc, out, err = call_tool(
        capsys,
        *SMALL,
        f"config.LOW_SHOT_BENCHMARK.FEATURES.PATH={folder}",
        f"config.CHECKPOINT.DIR={tmp_path}",
        "config.LOW_SHOT_BENCHMARK.METHOD=svm",
        "config.LOW_SHOT_BENCHMARK.SAMPLES_PER_CLASS=[1,5]",
        "config.LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.SEEDS=[0,1]",
        "config.SVM.costs.costs_list=[0.1,1.0]",
    )
    assert rc == 0, err[-3000:]
    m = LINE.match(out.strip().splitlines()[-1])
    assert m and m.groups()[1:] == ("svm", "2", "trunk", "200", "100")
    assert list(per_k(m.group(1))) == [1, 5]
    report = json.loads((tmp_path / "low_shot_results.json").read_text())
    assert report["svm_costs"] == [0.1, 1.0] and report["lambda"] is None
    for r in report["layers"]["trunk"]["results"]:
        assert len(r["mean_ap"]) == 2 and all(0 < ap <= 100 for ap in r["mean_ap"])
        assert all(c in (0.1, 1.0) for c in r["chosen"])
    assert not list(tmp_path.glob("rank*.npy"))  # nothing extracted
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("rank*.npy")} == stamp


def test_k_above_the_smallest_class_is_exit_code_2_and_one_line(
    one_run: dict[str, Any], tmp_path: Path
) -> None:
    train = ExtractedFeaturesLoader.load_features(str(one_run["dir"]), "trunk", "train")
    smallest = int(np.bincount(train["targets"]).min())
    assert 10 <= smallest < 50
    proc = run_cli(
        *SMALL,
        f"config.LOW_SHOT_BENCHMARK.FEATURES.PATH={one_run['dir']}",
        f"config.CHECKPOINT.DIR={tmp_path}",
        "config.LOW_SHOT_BENCHMARK.SAMPLES_PER_CLASS=[1,50]",
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "low_shot_test: error: config.LOW_SHOT_BENCHMARK.SAMPLES_PER_CLASS=[1, 50]: "
        f"the smallest TRAIN class has {smallest} samples"
    ), lines[0]
    assert not (tmp_path / "low_shot_results.json").exists()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("config.LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.SEEDS=[0,-1]", "SEEDS"),
        ("config.LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.SEEDS=[]", "SEEDS"),
        ("config.LOW_SHOT_BENCHMARK.SAMPLES_PER_CLASS=[0]", "SAMPLES_PER_CLASS"),
        ("config.LOW_SHOT_BENCHMARK.SAMPLES_PER_CLASS=[]", "SAMPLES_PER_CLASS"),
        ("config.LOW_SHOT_BENCHMARK.METHOD=knn", "config.LOW_SHOT_BENCHMARK.METHOD"),
        ("config.LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.LAMBDA=[1.0,0]", "LAMBDA"),
        ("config.SVM.costs.costs_list=[fast]", "config.SVM.costs"),
        ("config.LOW_SHOT_BENCHMARK.FEATURE_TYPE=heads", "FEATURES.PATH"),  # not extracted
        ("config.LOW_SHOT_BENCHMARK.FEATURES.PATH=/no/such/dir", "FEATURES.PATH"),
    ],
)
def test_config_mistakes_name_the_key(
    one_run: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    override: str,
    key: str,
) -> None:
    rc, _out, err = call_tool(
        capsys,
        *SMALL,
        f"config.LOW_SHOT_BENCHMARK.FEATURES.PATH={one_run['dir']}",
        f"config.CHECKPOINT.DIR={tmp_path}",
        override,
    )
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("low_shot_test: error: "), err
    assert key in lines[0]
    assert not (tmp_path / "low_shot_results.json").exists()


def test_svm_on_an_unknown_class_is_a_config_error(
    one_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Data errors of the classifiers are one error line too, not a traceback."""
    rc, _out, err = call_tool(
        capsys,
        *SMALL,
        f"config.LOW_SHOT_BENCHMARK.FEATURES.PATH={one_run['dir']}",
        f"config.CHECKPOINT.DIR={tmp_path}",
        "config.LOW_SHOT_BENCHMARK.METHOD=svm",
        "config.SVM.cls_list=[42]",
    )
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("low_shot_test: error: low-shot svm"), err
    assert "SVM.cls_list: no TRAIN sample of class [42]" in lines[0]

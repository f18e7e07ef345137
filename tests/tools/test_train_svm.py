"""tools/train_svm.py end to end on digits (random-init narrow ResNet-18 trunk).

One run is the real command line (extraction, then the SVMs); the others read its
features (``SVM.FEATURES.PATH``) and call the tool's ``main`` in this process.
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
from tests.evaluation.test_svm import reference_11point_ap, reference_interpolated_ap
from tests.integration._runs import REPO
from vissl.engines.extract_features import ExtractedFeaturesLoader
from vissl.evaluation.benchmarks import svm as tool
from vissl.evaluation.cli import run_tool

TOOL = os.path.join(REPO, "tools", "train_svm.py")
CONFIG = "config=benchmark/svm/digits/svm_digits_quick_start"
SMALL = [
    CONFIG,
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",  # trunk output: 128 features
    "config.DATA.TRAIN.DATA_LIMIT=200",
    "config.DATA.TEST.DATA_LIMIT=100",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=64",
    "config.DATA.TEST.BATCHSIZE_PER_REPLICA=64",
]
LINE = re.compile(
    r"^svm: mAP (\d+\.\d\d)% mAP\(11-point\) (\d+\.\d\d)% top-1 (\d+\.\d\d)% "
    r"layer=(\S+) classes=(\d+) train=(\d+) test=(\d+)$"
)

pytestmark = pytest.mark.integration


def call_tool(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the tool's ``main`` in this process as the command line would."""
    capsys.readouterr()
    rc = run_tool("train_svm", tool.main, list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    return run_script(TOOL, *args, cwd=REPO, env=env)


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The real command line: extraction into CHECKPOINT.DIR, then the SVMs."""
    out = tmp_path_factory.mktemp("svm") / "run"
    proc = run_cli(*SMALL, f"config.CHECKPOINT.DIR={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": out, "stdout": proc.stdout, "stderr": proc.stderr}


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_cli_prints_the_result_last_and_writes_the_json(one_run: dict[str, Any]) -> None:
    last = one_run["stdout"].strip().splitlines()[-1]
    m = LINE.match(last)
    assert m, last
    mean_ap, mean_ap_11, top1, layer, n_cls, n_train, n_test = m.groups()
    assert (layer, n_cls, n_train, n_test) == ("trunk", "10", "200", "100")
    assert "PARAMS_FILE is empty" in one_run["stderr"]  # random-init warning
    assert "Traceback" not in one_run["stderr"]

    folder: Path = one_run["dir"]
    report = json.loads((folder / "svm_results.json").read_text())
    assert report["benchmark"] == "svm" and report["features"] == str(folder)
    assert report["settings"]["costs"] == [0.01, 0.1, 1.0, 10.0, 100.0]
    res = report["layers"]["trunk"]
    assert float(mean_ap) == pytest.approx(res["mean_ap"], abs=0.005)
    assert float(mean_ap_11) == pytest.approx(res["mean_ap_11pt"], abs=0.005)
    assert float(top1) == pytest.approx(res["top1"], abs=0.005)
    assert res["classes"] == list(range(10)) and (res["train"], res["test"]) == (200, 100)
    assert res["dim"] == 128
    assert res["mean_ap"] == pytest.approx(np.mean(list(res["per_class_ap"].values())))
    for cls, row in enumerate(res["cross_val_ap"]):  # each class at its best CV cost
        assert res["chosen_costs"][cls] == res["costs"][int(np.argmax(row))]
    assert sorted(p.name for p in (folder / "svm_trunk").iterdir()) == [
        f"cls{c}.npz" for c in range(10)
    ]

    # The figures again, independently: scikit-learn's LinearSVC with VISSL's parameters
    # at the chosen costs, APs from their definitions, top-1 from the best SVM score.
    from sklearn.svm import LinearSVC

    train = ExtractedFeaturesLoader.load_features(str(folder), "trunk", "train")
    test = ExtractedFeaturesLoader.load_features(str(folder), "trunk", "test")

    def l2(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        return x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-5)

    x_train, x_test = l2(train["features"]), l2(test["features"])
    scores = np.zeros((len(x_test), 10))
    for cls in range(10):
        svm = LinearSVC(
            C=res["chosen_costs"][cls],
            class_weight={1: 2, -1: 1},
            intercept_scaling=1.0,
            penalty="l2",
            loss="squared_hinge",
            dual=True,
            tol=1e-4,
            max_iter=2000,
            random_state=0,
        ).fit(x_train, np.where(train["targets"] == cls, 1, -1))
        scores[:, cls] = svm.decision_function(x_test)
        positives = test["targets"] == cls
        assert res["per_class_ap"][str(cls)] == pytest.approx(
            100 * reference_interpolated_ap(scores[:, cls], positives), abs=1e-6
        )
        assert res["per_class_ap_11pt"][str(cls)] == pytest.approx(
            100 * reference_11point_ap(scores[:, cls], positives), abs=1e-6
        )
    assert res["top1"] == pytest.approx(100 * (scores.argmax(1) == test["targets"]).mean())
    # a random-init trunk is far better than chance on digits, not perfect
    assert 10.0 < res["top1"] < 100.0 and 10.0 < res["mean_ap"] < 100.0


def test_features_path_reuses_the_saved_svms(
    one_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder: Path = one_run["dir"]
    expected = one_run["stdout"].strip().splitlines()[-1]
    stamp = {p.name: p.stat().st_mtime_ns for p in folder.glob("rank*.npy")}
    base = [*SMALL, f"config.SVM.FEATURES.PATH={folder}"]
    # the SVMs saved by the first run (same features and settings) are reused
    rc, out, err = call_tool(capsys, *base, f"config.CHECKPOINT.DIR={folder}")
    assert rc == 0, err[-3000:]
    assert out.strip().splitlines()[-1] == expected
    assert "reused 10 SVMs" in out
    # elsewhere, or with force_retrain, they are trained again, to the same result;
    # FEATURE_TYPE "" is VISSL's choice of layers: the trunk for this config
    for extra in (["config.SVM.force_retrain=True"], ["config.SVM.FEATURE_TYPE=''"]):
        out_dir = tmp_path / extra[0].split("=")[0].rsplit(".", 1)[-1]
        rc, out, err = call_tool(capsys, *base, f"config.CHECKPOINT.DIR={out_dir}", *extra)
        assert rc == 0, err[-3000:]
        assert out.strip().splitlines()[-1] == expected
        assert "reused" not in out
        assert (out_dir / "svm_results.json").is_file()
        assert not list(out_dir.glob("rank*.npy"))  # nothing extracted
    assert {p.name: p.stat().st_mtime_ns for p in folder.glob("rank*.npy")} == stamp


def test_cls_list_restricts_the_classes(
    one_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, err = call_tool(
        capsys,
        *SMALL,
        f"config.SVM.FEATURES.PATH={one_run['dir']}",
        f"config.CHECKPOINT.DIR={tmp_path}",
        "config.SVM.cls_list=[1,7]",
        "config.SVM.costs.costs_list=[1.0]",
    )
    assert rc == 0, err[-3000:]
    m = LINE.match(out.strip().splitlines()[-1])
    assert m and m.group(5) == "2"
    res = json.loads((tmp_path / "svm_results.json").read_text())["layers"]["trunk"]
    assert res["classes"] == [1, 7] and set(res["per_class_ap"]) == {"1", "7"}
    assert res["chosen_costs"] == [1.0, 1.0]


def test_unknown_cost_is_exit_code_2_and_one_line(tmp_path: Path) -> None:
    proc = run_cli(
        *SMALL, "config.SVM.costs.costs_list=[0.1,fast]", f"config.CHECKPOINT.DIR={tmp_path}"
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("train_svm: error: config.SVM.costs: "), lines[0]
    assert "'fast'" in lines[0]
    assert not list(tmp_path.glob("rank*.npy"))  # failed before extracting


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("config.SVM.costs.costs_list=[-1.0]", "config.SVM.costs"),
        ("config.SVM.costs.costs_list=[]", "config.SVM.costs"),
        ("config.SVM.costs.base=10.0", "config.SVM.costs.power_range"),  # 10 ** 400
        ("config.SVM.loss=hinged", "config.SVM.loss"),
        ("config.SVM.penalty=l1", "config.SVM.dual"),
        ("config.SVM.cross_val_folds=1", "config.SVM.cross_val_folds"),
        ("config.SVM.cls_list=[42]", "config.SVM.cls_list"),  # no such class in TRAIN
        ("config.SVM.FEATURE_TYPE=bogus", "config.SVM.FEATURE_TYPE"),
        ("config.SVM.FEATURE_TYPE=heads", "FEATURES.PATH"),  # not extracted
        ("config.SVM.FEATURES.PATH=/no/such/dir", "FEATURES.PATH"),
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
        f"config.SVM.FEATURES.PATH={one_run['dir']}",
        f"config.CHECKPOINT.DIR={tmp_path}",
        "config.SVM.costs.power_range=[300,400]",  # only used with base > 0
        override,
    )
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("train_svm: error: "), err
    assert key in lines[0]
    assert not (tmp_path / "svm_results.json").exists()

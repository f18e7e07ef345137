"""tools/nearest_neighbor_test.py end to end on digits (random-init narrow ResNet-18 trunk).

One extraction runs the real command line; the others call the tool's ``main`` in this
process (2 processes: forked gloo workers on the CPU).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._cli import run_script
from tests.evaluation.test_knn import reference_knn
from tests.integration._runs import REPO
from vissl.engines.extract_features import ExtractedFeaturesLoader
from vissl.evaluation.benchmarks import nearest_neighbor as tool
from vissl.evaluation.cli import run_tool

TOOL = os.path.join(REPO, "tools", "nearest_neighbor_test.py")
CONFIG = "config=benchmark/nearest_neighbor/digits/nn_digits_quick_start"
SMALL = [
    CONFIG,
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",  # trunk output: 128 features
    "config.DATA.TRAIN.DATA_LIMIT=200",
    "config.DATA.TEST.DATA_LIMIT=100",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=64",
    "config.DATA.TEST.BATCHSIZE_PER_REPLICA=64",
    "config.EXTRACT_FEATURES.CHUNK_THRESHOLD=80",
]
LINE = re.compile(
    r"^nearest_neighbor: top-1 (\d+\.\d\d)% \(error (\d+\.\d\d)%\) top-5 (\d+\.\d\d)% "
    r"k=(\d+) sigma=([\d.e+-]+) layer=(\S+) train=(\d+) test=(\d+)$"
)
OUTPUTS = ("predictions", "targets", "image_indices")

pytestmark = pytest.mark.integration


def call_tool(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the tool's ``main`` in this process as the command line would."""
    capsys.readouterr()
    rc = run_tool("nearest_neighbor_test", tool.main, list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def result_lines(stdout: str) -> list[re.Match[str]]:
    return [m for line in stdout.splitlines() if (m := LINE.match(line.strip()))]


def knn_outputs(folder: Path, layer: str = "trunk") -> dict[str, np.ndarray]:
    return {n: np.load(folder / f"kNN_{layer}_output_{n}.npy") for n in OUTPUTS}


@pytest.fixture(scope="module")
def one_proc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The real command line, one process: extraction into CHECKPOINT.DIR, then the kNN."""
    out = tmp_path_factory.mktemp("nn") / "one"
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    proc = run_script(TOOL, *SMALL, f"config.CHECKPOINT.DIR={out}", cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"dir": out, "stdout": proc.stdout, "stderr": proc.stderr}


def test_cli_prints_the_result_last_and_saves_vissl_files(one_proc: dict[str, Any]) -> None:
    last = one_proc["stdout"].strip().splitlines()[-1]
    m = LINE.match(last)
    assert m, last
    top1, err1, top5, k, sigma, layer, n_train, n_test = m.groups()
    assert (k, sigma, layer, n_train, n_test) == ("20", "0.07", "trunk", "200", "100")
    assert float(top1) + float(err1) == pytest.approx(100.0)
    assert "PARAMS_FILE is empty" in one_proc["stderr"]  # random-init warning

    folder: Path = one_proc["dir"]
    saved = knn_outputs(folder)
    test = ExtractedFeaturesLoader.load_features(str(folder), "trunk", "test")
    train = ExtractedFeaturesLoader.load_features(str(folder), "trunk", "train")
    assert train["features"].shape == (200, 128) and test["features"].shape == (100, 128)
    assert np.array_equal(train["inds"], np.arange(200))
    assert np.array_equal(saved["image_indices"], np.arange(100))
    assert np.array_equal(saved["targets"], test["targets"])
    assert saved["predictions"].shape == (100, 5)
    # The printed accuracies are those of the saved predictions ...
    hits = saved["predictions"] == saved["targets"].reshape(-1, 1)
    assert float(top1) == pytest.approx(100.0 * hits[:, 0].mean(), abs=0.005)
    assert float(top5) == pytest.approx(100.0 * hits.any(axis=1).mean(), abs=0.005)
    # ... which equal an independent computation (scikit-learn + numpy) on the features.
    ref = reference_knn(
        train["features"], train["targets"], test["features"], test["targets"], 20, 0.07
    )
    assert np.array_equal(saved["predictions"], ref["predictions"])
    assert 0.0 < float(top1) < 100.0
    # Several chunks per rank were written (CHUNK_THRESHOLD=80, 200 TRAIN samples).
    assert len(list(folder.glob("rank0_chunk*_train_trunk_features.npy"))) >= 2


def test_two_processes_equal_one(
    one_proc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    two = tmp_path / "two"
    rc, out, err = call_tool(
        capsys,
        *SMALL,
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
        "config.MULTI_PROCESSING_METHOD=fork",
        f"config.CHECKPOINT.DIR={two}",
    )
    assert rc == 0, err[-3000:]
    assert list(two.glob("rank1_chunk*_test_trunk_features.npy"))  # both ranks wrote
    one: Path = one_proc["dir"]
    for split in ("train", "test"):
        a = ExtractedFeaturesLoader.load_features(str(one), "trunk", split)
        b = ExtractedFeaturesLoader.load_features(str(two), "trunk", split)
        assert np.array_equal(a["inds"], b["inds"])
        assert np.array_equal(a["targets"], b["targets"])
        np.testing.assert_allclose(b["features"], a["features"], rtol=1e-5, atol=1e-6)
    for name, value in knn_outputs(two).items():
        assert np.array_equal(value, knn_outputs(one)[name]), name
    assert result_lines(out)[-1].group(0) == one_proc["stdout"].strip().splitlines()[-1]


def test_features_path_reads_extracted_features(
    one_proc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one: Path = one_proc["dir"]
    expected_line = one_proc["stdout"].strip().splitlines()[-1]
    stamp = {p.name: p.stat().st_mtime_ns for p in one.glob("rank*.npy")}
    runs = {
        "plain": [],
        "optimize_memory": ["config.NEAREST_NEIGHBOR.OPTIMIZE_MEMORY=True"],
        # VISSL's layer choice: the config's FEATURE_EVAL_SETTINGS extract the trunk.
        "vissl_layers": ["config.NEAREST_NEIGHBOR.FEATURE_TYPE=''"],
    }
    for name, extra in runs.items():
        out_dir = tmp_path / name
        rc, out, err = call_tool(
            capsys,
            *SMALL,
            f"config.NEAREST_NEIGHBOR.FEATURES.PATH={one}",
            f"config.CHECKPOINT.DIR={out_dir}",
            *extra,
        )
        assert rc == 0, err[-3000:]
        assert out.strip().splitlines()[-1] == expected_line, name
        assert not list(out_dir.glob("rank*.npy")), name  # nothing extracted
        for key, value in knn_outputs(out_dir).items():
            assert np.array_equal(value, knn_outputs(one)[key]), (name, key)
    # The folder read was left untouched.
    assert {p.name: p.stat().st_mtime_ns for p in one.glob("rank*.npy")} == stamp

    # TOPK above the number of TRAIN samples: every sample votes, with a warning.
    rc, out, err = call_tool(
        capsys,
        *SMALL,
        f"config.NEAREST_NEIGHBOR.FEATURES.PATH={one}",
        f"config.CHECKPOINT.DIR={tmp_path / 'big_k'}",
        "config.NEAREST_NEIGHBOR.TOPK=1000",
    )
    assert rc == 0, err[-3000:]
    assert result_lines(out)[-1].group(4) == "200"
    assert "TOPK=1000 is more than the 200 TRAIN samples" in out


def test_topk_list_as_in_vissl() -> None:
    """VISSL's TOPK may be a list of k values (the tool runs each); config validation
    decides whether a list gets through (NEAREST_NEIGHBOR.TOPK's type)."""
    from vissl.config.attr_dict import AttrDict
    from vissl.errors import ConfigError

    nn = AttrDict({"TOPK": [5, 20], "SIGMA": 0.1, "USE_CUDA": False})
    assert tool.check_nn_settings(nn) == ([5, 20], 0.1, "cpu")
    nn.TOPK = 7
    assert tool.check_nn_settings(nn) == ([7], 0.1, "cpu")
    for bad in ([], [5, 0], 0, True, "20"):
        nn.TOPK = bad
        with pytest.raises(ConfigError, match=r"config\.NEAREST_NEIGHBOR\.TOPK"):
            tool.check_nn_settings(nn)


def test_config_mistake_is_exit_code_2_and_one_line(tmp_path: Path) -> None:
    proc = run_script(
        TOOL, *SMALL, "config.NEAREST_NEIGHBOR.TOPK=0", f"config.CHECKPOINT.DIR={tmp_path}"
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("nearest_neighbor_test: error: config.NEAREST_NEIGHBOR.TOPK ")
    assert not list(tmp_path.glob("rank*.npy"))  # failed before extracting


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("config.NEAREST_NEIGHBOR.FEATURE_TYPE=bogus", "config.NEAREST_NEIGHBOR.FEATURE_TYPE"),
        ("config.NEAREST_NEIGHBOR.SIGMA=0", "config.NEAREST_NEIGHBOR.SIGMA"),
        ("config.NEAREST_NEIGHBOR.TOPK=[]", "config.NEAREST_NEIGHBOR.TOPK"),
        ("config.NEAREST_NEIGHBOR.FEATURES.PATH=/no/such/dir", "FEATURES.PATH"),
        ("config.NEAREST_NEIGHBOR.FEATURE_TYPE=heads", "FEATURES.PATH"),  # not extracted
    ],
)
def test_config_mistakes_name_the_key(
    one_proc: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    override: str,
    key: str,
) -> None:
    rc, _out, err = call_tool(
        capsys,
        *SMALL,
        f"config.NEAREST_NEIGHBOR.FEATURES.PATH={one_proc['dir']}",
        f"config.CHECKPOINT.DIR={tmp_path}",
        override,
    )
    assert rc == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("nearest_neighbor_test: error: "), err
    assert key in lines[0]

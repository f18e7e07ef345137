"""tools/plot_metrics.py: stdout.json / metrics.json of runs -> one PNG of curves.

The logs come from a real run (the tiny supervised ResNet, 2 epochs, each followed by a
test phase, with an accuracy meter), written by vissl's own logging hooks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tests._tiny_run import SMALL, TINY
from tests.integration._runs import REPO, run_config
from vissl.evaluation import plot_metrics as pm

TOOL = os.path.join(REPO, "tools", "plot_metrics.py")
MISSING = 'error: tools/plot_metrics.py needs matplotlib: pip install -e ".[plots]"'
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_run") / "tiny_supervised"
    run_config(
        TINY,
        *SMALL,
        "config.LOG_FREQUENCY=1",
        "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=false",
        f"config.CHECKPOINT.DIR={folder}",
    )
    assert (folder / "stdout.json").is_file() and (folder / "metrics.json").is_file()
    return folder


def assert_png(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


@pytest.mark.slow
def test_one_real_run(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = pm.read_run(str(run_dir), "tiny")
    assert [s[0] for s in run.steps] == list(range(1, 9))  # 2 epochs x 4 steps, LOG_FREQUENCY 1
    assert all(s[2] > 0 for s in run.steps)
    assert [e for e, _ in run.phases["train"]["loss"]] == [1, 2]
    assert [e for e, _ in run.phases["test"]["accuracy_list_meter_top_1"]] == [1, 2]

    out = tmp_path / "plots" / "curves.png"
    assert pm.run_cli([str(run_dir), "--out", str(out)]) == 0
    names = ["loss", "lr", "phase loss", "accuracy_list_meter_top_1", "accuracy_list_meter_top_5"]
    assert capsys.readouterr().out.strip() == f"wrote {out}: {', '.join(names)} of 1 run(s)"
    width, height = assert_png(out)
    assert (width, height) == (1260, 620)  # 3 x 2 panels of 4.2 x 3.1 in at 100 dpi

    assert pm.panels([run], ["top_1"]) == names[:4]  # --metrics top_1


def test_several_runs_overlay_with_a_legend_of_run_names(run_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "second_run"
    shutil.copytree(run_dir, other, ignore=shutil.ignore_patterns("*.torch", "tensorboard"))
    runs = [pm.read_run(str(run_dir), "first"), pm.read_run(str(other), "second")]
    fig, names = pm.draw(runs)
    try:
        loss_ax = fig.axes[names.index("loss")]
        assert [t.get_text() for t in loss_ax.get_legend().get_texts()] == ["first", "second"]
        top1 = fig.axes[names.index("accuracy_list_meter_top_1")]
        legend = [t.get_text() for t in top1.get_legend().get_texts()]
        assert legend == ["first train", "first test", "second train", "second test"]
        colors = {line.get_color() for line in loss_ax.get_lines()}
        assert len(colors) == 2
    finally:
        pm._pyplot().close(fig)
    # the default labels are the folder names; equal names fall back to the paths
    assert pm._labels([str(run_dir), str(other)], None) == ["tiny_supervised", "second_run"]
    assert pm._labels(["a/run", "b/run"], None) == ["a/run", "b/run"]

    # the command line, in a subprocess
    out = tmp_path / "both.png"
    proc = subprocess.run(
        [sys.executable, "tools/plot_metrics.py", str(run_dir), str(other), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "of 2 run(s)" in proc.stdout
    assert_png(out)
    assert out.stat().st_size < 150_000


def test_resumed_and_restarted_logs_are_read_as_the_run_went(tmp_path: Path) -> None:
    def line(iteration: int, loss: float) -> str:
        return json.dumps(
            {"iteration": iteration, "phase_idx": 0, "train": True, "loss": loss, "lr": 0.1}
        )

    # logged 1..3, resumed from iteration 1 (2 and 3 logged again), went on to 4
    lines = [line(1, 5.0), line(2, 4.0), line(3, 3.0), line(2, 4.5), line(3, 3.5), line(4, 2.0)]
    (tmp_path / "stdout.json").write_text("\n".join(lines) + "\n")
    run = pm.read_run(str(tmp_path), "r")
    assert [(s[0], s[1]) for s in run.steps] == [(1, 5.0), (2, 4.5), (3, 3.5), (4, 2.0)]
    assert "phase loss" not in pm.panels([run], [])  # no metrics.json: step curves only


def test_phase_end_records_of_the_online_monitors_keep_the_step_curve(tmp_path: Path) -> None:
    def line(iteration: int, loss: float) -> str:
        return json.dumps(
            {"iteration": iteration, "phase_idx": 0, "train": True, "loss": loss, "lr": 0.1}
        )

    phase_end = {"iteration": 2, "phase_idx": 0, "train_phase_idx": 0, "ep": 0, "train": True}
    phase_end |= {"phase_end": True, "train_online_knn_top_1": 91.5}
    lines = [line(1, 5.0), line(2, 4.0), json.dumps(phase_end), line(3, 3.0)]
    (tmp_path / "stdout.json").write_text("\n".join(lines) + "\n")
    run = pm.read_run(str(tmp_path), "r")
    assert [(s[0], s[1]) for s in run.steps] == [(1, 5.0), (2, 4.0), (3, 3.0)]


def test_missing_matplotlib_is_one_line(
    run_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "x.png"
    assert pm.run_cli([str(run_dir), "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [MISSING]
    assert not out.exists()
    # and as a command: exit code 2, that line only
    code = (
        "import runpy, sys; sys.modules['matplotlib'] = None; "
        f"sys.argv = ['tools/plot_metrics.py', {str(run_dir)!r}, '--out', {str(out)!r}]; "
        "runpy.run_path('tools/plot_metrics.py', run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [MISSING]


@pytest.mark.parametrize(
    ("files", "args", "message"),
    [
        (None, [], "is not a folder"),
        ({}, [], "has neither stdout.json nor metrics.json"),
        ({"stdout.json": ""}, [], "stdout.json is empty"),
        (
            {"metrics.json": '{"iteration": 2, "phase_idx": 0}\n\n'},
            [],
            "metrics.json line 2 is empty",
        ),
        (
            {"stdout.json": '{"iteration": 1, "loss": 2.0}\n{"iteration": 2, "lo'},
            [],
            "stdout.json line 2 is not valid JSON",
        ),
        ({"stdout.json": "[1, 2]\n"}, [], "line 1 is not a vissl log record"),
        (
            {"stdout.json": '{"iteration": 1, "loss": 2.0}\n'},
            ["--labels", "a", "b"],
            "--labels has 2 names for 1 run",
        ),
        ({"stdout.json": '{"iteration": 1, "loss": 2.0}\n'}, ["--out", "x.jpg"], "ending in .png"),
        (
            {"metrics.json": '{"iteration": 1, "phase_idx": 0, "note": "x"}\n'},
            [],
            "nothing to plot",
        ),
    ],
)
def test_bad_inputs_give_one_line_errors(
    tmp_path: Path,
    files: dict[str, str] | None,
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = tmp_path / "run"
    if files is not None:
        run.mkdir()
        for name, text in files.items():
            (run / name).write_text(text)
    out = ["--out", str(tmp_path / "o.png")] if "--out" not in args else []
    assert pm.run_cli([str(run), *out, *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "o.png").exists()


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        pm.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for fragment in ("stdout.json", "metrics.json", "--out", "--labels", "examples:", ".[plots]"):
        assert fragment in text

"""``extra_scripts/digits_knn_curve.py``: which checkpoints it probes, in which order, with
which training minutes (summed from the run's log.txt), and its errors. The probe itself
(tools/nearest_neighbor_test.py) is replaced by a recording stand-in: the tool has its own
tests (tests/tools/test_nearest_neighbor_tool.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.extra_scripts._helpers import assert_one_line_error, import_script, run_as_main

curve = import_script("digits_knn_curve")

LOG = """INFO 17:29:10 vissl.hooks.log_hooks:289] phase 0 (train) done in 15.0s: average loss 38.4
INFO 17:29:30 vissl.hooks.log_hooks:289] phase 1 (train) done in 45.0s: average loss 37.4
INFO 17:29:49 vissl.hooks.log_hooks:289] phase 2 (train) done in 60.0s: average loss 35.2
"""


def _run_dir(tmp_path: Path, names: list[str], log: str | None = LOG) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for name in [*names, "checkpoint.torch", "model_phase1.torch.tmp"]:
        (run / name).write_bytes(b"")
    if log is not None:
        (run / "log.txt").write_text(log)
    return run


def test_each_phase_checkpoint_is_probed_in_order_with_its_training_minutes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_dir(
        tmp_path,
        [
            "model_phase2.torch",
            "model_phase0.torch",
            "model_phase1.torch",
            "model_final_checkpoint_phase2.torch",
        ],
    )
    calls: list[tuple[str, str, str, tuple[str, ...]]] = []
    errors = {
        "": 50.0,
        "model_phase0.torch": 40.0,
        "model_phase1.torch": 30.5,
        "model_final_checkpoint_phase2.torch": 20.25,
    }

    def fake_probe(config: str, params_file: str, out: str, overrides: list[str]) -> float:
        calls.append((config, params_file, out, tuple(overrides)))
        return errors[Path(params_file).name if params_file else ""]

    monkeypatch.setattr(curve, "probe", fake_probe)
    assert curve.main([str(run), "--probe", "p/q", "--random", "--", "a=1", "b=2"]) == 0
    # the random init first, then phases 0, 1, 2 (the final checkpoint of phase 2 only)
    assert [(Path(c[1]).name, Path(c[2]).name) for c in calls] == [
        ("", "random"),
        ("model_phase0.torch", "phase0"),
        ("model_phase1.torch", "phase1"),
        ("model_final_checkpoint_phase2.torch", "phase2"),
    ]
    assert {c[0] for c in calls} == {"p/q"} and {c[3] for c in calls} == {("a=1", "b=2")}
    assert all(Path(c[2]).parent == run / "knn_curve" for c in calls)
    assert capsys.readouterr().out.strip().splitlines() == [
        "| epochs | training minutes | kNN error |",
        "|---|---|---|",
        "| 0 | 0.0 | 50.00% |",
        "| 1 | 0.2 | 40.00% |",  # 15 s
        "| 2 | 1.0 | 30.50% |",  # 15 + 45 s
        "| 3 | 2.0 | 20.25% |",  # 15 + 45 + 60 s
    ]


def test_minutes_are_unknown_where_the_log_misses_a_phase(tmp_path: Path) -> None:
    seconds = curve.phase_seconds(LOG.replace("phase 1 (train)", "phase 7 (train)"))
    assert seconds == {0: 15.0, 7: 45.0, 2: 60.0}
    assert curve.minutes_until(seconds, 0) == pytest.approx(0.25)
    assert curve.minutes_until(seconds, 2) is None
    # a resumed run logs a phase again: its last time counts
    assert curve.phase_seconds(LOG + LOG.splitlines()[0].replace("15.0s", "9.0s"))[0] == 9.0
    assert "| 4 | ? | 1.00% |" in curve.table([(4, None, 1.0)])


def test_a_run_folder_without_checkpoints_or_no_folder_is_one_line_error(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [], log=None)
    code, _, stderr = run_as_main("digits_knn_curve", str(run), "--probe", "x")
    assert_one_line_error(code, stderr, "no model_phase<N>.torch", "CHECKPOINT_FREQUENCY=1")
    code, _, stderr = run_as_main("digits_knn_curve", str(tmp_path / "nope"), "--probe", "x")
    assert_one_line_error(code, stderr, "is not a folder")


@pytest.mark.parametrize(
    ("returncode", "stdout", "message"),
    [
        (1, "", "failed: boom"),
        (0, "no result line", "failed: boom"),
        (0, "x\nnearest_neighbor: top-1 98.61% (error 1.39%) top-5 100.00% k=20", None),
    ],
)
def test_the_probe_reads_the_tools_last_line_and_reports_a_failure(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    returncode: int,
    stdout: str,
    message: str | None,
) -> None:
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, returncode, stdout, "trace\nboom\n")

    monkeypatch.setattr(curve.subprocess, "run", fake_run)
    args = ("c/d", "/r/model_phase0.torch", "/o/phase0", ["k=v"])
    if message is None:
        assert curve.probe(*args) == 1.39
    else:
        with pytest.raises(
            curve.ScriptError, match=f"the probe of /r/model_phase0.torch {message}"
        ):
            curve.probe(*args)
    (cmd,) = seen
    assert cmd[1].endswith("tools/nearest_neighbor_test.py")
    assert cmd[2:] == [
        "config=c/d",
        "config.MODEL.WEIGHTS_INIT.PARAMS_FILE=/r/model_phase0.torch",
        "config.CHECKPOINT.DIR=/o/phase0",
        "k=v",
    ]


def test_phase_times_are_read_from_the_1_based_log_lines_too():
    """vissl's log counts phases from 1 (``phase 1/3 (train) done``); older logs from 0."""
    from tests.extra_scripts._helpers import import_script

    script = import_script("digits_knn_curve")
    new = "phase 1/3 (train) done in 15.0s: x\nphase 2/3 (train) done in 45.0s: x\n"
    old = "phase 0 (train) done in 15.0s: x\nphase 1 (train) done in 45.0s: x\n"
    assert script.phase_seconds(new) == script.phase_seconds(old) == {0: 15.0, 1: 45.0}


def test_a_saved_table_reads_back_and_plots_with_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--save`` writes the printed table; ``--plot PNG --tables NAME=FILE`` draws saved
    tables without probing (any data source: the probe config names it)."""
    run = _run_dir(tmp_path, ["model_phase0.torch", "model_phase1.torch"])
    monkeypatch.setattr(curve, "probe", lambda *args: 12.5)
    saved = tmp_path / "a.md"
    assert curve.main([str(run), "--probe", "nn/mnist5k", "--save", str(saved)]) == 0
    printed = capsys.readouterr().out
    assert saved.read_text() == printed
    assert curve.parse_table(printed) == [(1, 0.2, 12.5), (2, 1.0, 12.5)]  # 15 s, 60 s; one decimal
    assert curve.parse_table(curve.table([(3, None, 1.0)])) == [(3, None, 1.0)]
    pytest.importorskip("matplotlib")
    drawn: list[tuple[str, list[object]]] = []
    real_plot = curve.plot
    monkeypatch.setattr(
        curve, "plot", lambda curves, path: (drawn.extend(curves), real_plot(curves, path))
    )
    png = tmp_path / "curve.png"
    assert curve.main(["--plot", str(png), "--tables", f"mae={saved}", f"dino={saved}"]) == 0
    assert [label for label, _ in drawn] == ["mae", "dino"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_tables_are_one_line_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.md"
    empty.write_text("| epochs | training minutes | kNN error |\n")
    png = str(tmp_path / "x.png")
    for spec, message in [
        ("noequals", "NAME=TABLE.md"),
        (f"a={tmp_path / 'missing.md'}", "is not a file"),
        (f"a={empty}", "no '| epochs"),
    ]:
        code, _, stderr = run_as_main("digits_knn_curve", "--plot", png, "--tables", spec)
        assert_one_line_error(code, stderr, message)

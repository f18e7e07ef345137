"""A newcomer's mistakes, run as a user would: each ends with one line naming the mistake.

``python tools/run_distributed_engines.py ...`` with a YAML syntax error, a head of the wrong
width, an unknown config name, a plugin that does not import, and a CHECKPOINT.DIR that
cannot be created. Each exits with 2 and prints one ``vissl: error:`` line (the plugin case
adds the user's own file and line) and no traceback.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests._cli import run_script
from tests.integration._runs import REPO

TOOL = os.path.join(REPO, "tools", "run_distributed_engines.py")


def run_tool(cwd: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
    return run_script(TOOL, *args, cwd=cwd, env=env, timeout=300)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single error line: asserts exit 2, no traceback, and one ``vissl: error:``."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("vissl: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.integration
def test_a_tab_in_a_yaml_config_names_the_file_and_line(tmp_path: Path) -> None:
    folder = tmp_path / "configs" / "config"
    folder.mkdir(parents=True)
    (folder / "mine.yaml").write_text("config:\n  OPTIMIZER:\n\tnum_epochs: 2\n")
    line = error_line(run_tool(tmp_path, "config=mine"))
    assert f"{folder / 'mine.yaml'}:3:1: YAML syntax error" in line
    assert "tabs" in line


@pytest.mark.integration
def test_a_head_of_the_wrong_width_names_the_head_and_both_widths(tmp_path: Path) -> None:
    proc = run_tool(
        REPO,
        "config=quick_start",
        "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [100, 64]}]]",
        f"config.CHECKPOINT.DIR={tmp_path / 'run'}",
    )
    line = error_line(proc)
    assert "config.MODEL.HEAD.PARAMS[0]: head 'mlp' takes inputs of width 100" in line
    assert "the trunk's output has width 256" in line  # quick_start: ResNet-18 at width 0.5
    assert "mat1 and mat2" not in proc.stderr
    assert not list((tmp_path / "run").glob("*.torch"))  # stopped when the model was built


@pytest.mark.slow
@pytest.mark.integration
def test_an_unknown_config_name_lists_the_closest_names() -> None:
    line = error_line(run_tool(REPO, "config=pretrain/simclr/simclr_8gpu_resnt"))
    assert "config=pretrain/simclr/simclr_8gpu_resnt: no such config" in line
    assert "Closest: pretrain/simclr/simclr_8gpu_resnet" in line
    # the file name alone finds it in its folder
    line = error_line(run_tool(REPO, "config=simclr_8gpu_resnet"))
    assert "Closest: pretrain/simclr/simclr_8gpu_resnet" in line


@pytest.mark.integration
def test_a_plugin_with_a_syntax_error_names_the_entry_and_the_users_line(tmp_path: Path) -> None:
    plugin = tmp_path / "my_hooks.py"
    plugin.write_text("import os\n\ndef on_step(task:\n    pass\n")
    proc = run_tool(REPO, "config=quick_start", f"config.IMPORTS=[os, {plugin}]")
    line = error_line(proc)
    assert line == f"vissl: error: config.IMPORTS[1] ({str(plugin)!r}) failed to import:"
    assert f'File "{plugin}", line 3' in proc.stderr
    assert "SyntaxError" in proc.stderr
    assert "importlib" not in proc.stderr and "vissl/" not in proc.stderr


@pytest.mark.integration
def test_a_checkpoint_dir_that_cannot_be_created_is_named_before_any_work(tmp_path: Path) -> None:
    proc = run_tool(REPO, "config=quick_start", "config.CHECKPOINT.DIR=/proc/vissl_cannot_be")
    line = error_line(proc)
    assert "config.CHECKPOINT.DIR='/proc/vissl_cannot_be' cannot be created" in line
    assert "samples from" not in proc.stderr  # no data set was read

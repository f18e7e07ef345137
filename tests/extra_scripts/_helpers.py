"""Running and importing the scripts of ``extra_scripts/`` in tests."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import runpy
import subprocess
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from tests._cli import run_script as run_forked
from tests.integration._runs import REPO

EXTRA_SCRIPTS = os.path.join(REPO, "extra_scripts")


def import_script(name: str) -> ModuleType:
    """``extra_scripts/<name>.py`` as a module (its folder on sys.path, as when it runs)."""
    if EXTRA_SCRIPTS not in sys.path:
        sys.path.insert(0, EXTRA_SCRIPTS)
    return importlib.import_module(name)


def run_script(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python extra_scripts/<name>.py args...`` from the repository root."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    return run_forked(
        os.path.join("extra_scripts", f"{name}.py"), *args, cwd=REPO, env=env, timeout=timeout
    )


def run_as_main(name: str, *args: str) -> tuple[int, str, str]:
    """``python extra_scripts/<name>.py args...`` in this process (its ``__main__`` block):
    ``(exit code, stdout, stderr)``."""
    import_script("_common")  # puts extra_scripts/ on sys.path, as running the file does
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = [os.path.join("extra_scripts", f"{name}.py"), *args]
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            runpy.run_path(os.path.join(EXTRA_SCRIPTS, f"{name}.py"), run_name="__main__")
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code if isinstance(exit_info.code, int) else 1
    finally:
        sys.argv = argv
    return code, stdout.getvalue(), stderr.getvalue()


def assert_one_line_error(code: int, stderr: str, *fragments: str) -> str:
    """Exit code 2 and one ``error: ...`` line on stderr holding ``fragments``, no traceback."""
    assert code == 2, (code, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def script_error(main: Callable[[Sequence[str] | None], int], *args: str) -> str:
    """The one ``error: ...`` line of ``main(args)`` run as the command line runs it."""
    common = import_script("_common")
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = common.run_script(main, list(args))
    assert code == 2, stderr.getvalue()
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]

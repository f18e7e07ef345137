"""Run a repository script as ``python SCRIPT ARGS...`` would, for the tests of the CLIs.

The child is forked from a server that imported torch and vissl once per test process
(``tests/docs/_zygote.py``), so a CLI test pays for the training it runs, not for
``import torch`` (several CPU-seconds each time). It gets its own process group, stdin
from ``/dev/null``, the ``env`` given (nothing else), and the exit status and output a
fresh interpreter would give. ``VISSL_TEST_FRESH=1`` runs each script in a fresh
interpreter instead; tests that signal process groups or need the ``spawn`` start method
call ``subprocess`` themselves.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path

from tests.docs._doc_blocks import Zygote

REPO = Path(__file__).resolve().parents[1]
_SERVER: Zygote | None = None


def run_script(
    script: str | os.PathLike[str],
    *args: str,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, script, *args], capture_output=True, text=True)``, forked.

    A relative ``script`` is taken from the repository's root. Raises
    ``subprocess.TimeoutExpired`` when the script outlives ``timeout`` (it is killed)."""
    global _SERVER
    path = Path(script) if os.path.isabs(script) else REPO / script
    cwd = Path(cwd) if cwd is not None else REPO
    env = dict(os.environ if env is None else env)
    command = [sys.executable, str(path), *args]
    if os.environ.get("VISSL_TEST_FRESH") == "1":
        return subprocess.run(
            command, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
        )
    if _SERVER is None:
        _SERVER = Zygote()
        atexit.register(_SERVER.close)
    result = _SERVER.run(path, list(args), cwd, env, timeout)
    if result.timed_out:
        raise subprocess.TimeoutExpired(command, timeout, result.stdout, result.stderr)
    return subprocess.CompletedProcess(command, result.returncode, result.stdout, result.stderr)

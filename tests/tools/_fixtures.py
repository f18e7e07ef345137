"""What the tests of the evaluation tools share: running a tool's ``main`` in this process
as its command line does, and detaching the log handlers the tools attach."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

from vissl.evaluation.cli import run_tool


@pytest.fixture(autouse=True)
def drop_vissl_log_handlers() -> Iterator[None]:
    """The tools log to the stdout of the moment (pytest's capture): detach it afterwards."""
    yield
    vissl_logger = logging.getLogger("vissl")
    for handler in list(vissl_logger.handlers):
        if getattr(handler, "_vissl", False):
            vissl_logger.removeHandler(handler)
            handler.close()


def call_main(
    capsys: pytest.CaptureFixture[str], prog: str, main: Callable[[list[str]], int], *args: str
) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``tools/<prog>.py args``, run in this process."""
    capsys.readouterr()
    rc = run_tool(prog, main, list(args))
    out, err = capsys.readouterr()
    return rc, out, err

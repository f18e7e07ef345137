"""What the scripts in ``extra_scripts/`` share: the help formatter and the error exit.

A user mistake (a missing folder, a file that is not a checkpoint, an unsupported trunk)
ends a script with one line ``error: ...`` on stderr and exit code 2, without a
traceback; argparse's own usage errors exit with 2 as well.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from vissl.errors import VisslError
from vissl.utils.cli import HelpFormatter  # noqa: F401  (the scripts import it from here)

#: Exit code of a user mistake (argparse's as well).
USAGE_ERROR = 2


class ScriptError(Exception):
    """A user mistake found by a script: its message is printed as ``error: <message>``."""


def one_line(message: object) -> str:
    """``message`` on one line (library errors may hold line breaks)."""
    return " ".join(str(message).split())


def run_script(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None) -> int:
    """``main(argv)``; a :class:`ScriptError` or a vissl user error becomes ``error: ...``.

    Returns:
        ``main``'s exit code, or :data:`USAGE_ERROR` after printing the error line.
    """
    try:
        return main(argv)
    except (ScriptError, VisslError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return USAGE_ERROR

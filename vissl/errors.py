"""Typed errors raised for user mistakes.

Every error says what was wrong, where (a config key path or registry name) and how to
fix it. They subclass the builtin exception a caller would naturally catch, so
``except KeyError`` / ``except ValueError`` keep working.
"""

from __future__ import annotations

import warnings
from typing import Any


class VisslWarning(UserWarning):
    """Base class of vissl's warnings about a user's config or setup (the message names
    the key). Shown as one line, ``<Category>: <message>``, without the file, line and
    Python source that Python prints for other warnings: the config key is the place to
    look, not vissl's source. Silence them with
    ``warnings.filterwarnings("ignore", category=VisslWarning)``."""


class UnsupportedConfigWarning(VisslWarning):
    """A config key VISSL knows but vissl does not implement (or maps to another
    behaviour, e.g. apex AMP to torch AMP)."""


_format_warning = warnings.formatwarning


def _one_line_for_vissl(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: Any = None
) -> str:
    if isinstance(category, type) and issubclass(category, VisslWarning):
        return f"{category.__name__}: {message}\n"
    return _format_warning(message, category, filename, lineno, line)


if not getattr(warnings.formatwarning, "_vissl", False):
    _one_line_for_vissl._vissl = True  # type: ignore[attr-defined]
    warnings.formatwarning = _one_line_for_vissl


class VisslError(Exception):
    """Base class of every error vissl raises for a user mistake."""


class ConfigError(VisslError, ValueError):
    """A config value or key is invalid. The message names the full key path."""

    def __init__(self, message: str, key_path: str | None = None) -> None:
        self.key_path = key_path
        super().__init__(message)


class UnknownKeyError(ConfigError, KeyError):
    """A config key that neither vissl nor VISSL knows."""

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return str(self.args[0])


class UnknownNameError(VisslError, KeyError):
    """A name looked up in a registry that holds no such entry."""

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateNameError(VisslError, ValueError):
    """A second registration under a name that is already taken."""


class DistributedSetupError(VisslError, RuntimeError):
    """The processes of a run could not be connected (a process group, a side group).

    The message says what failed and which setting (environment variable or config key)
    fixes it.
    """


class TrainingPreempted(VisslError):
    """Training stopped on SIGTERM/SIGUSR1 after saving a checkpoint.

    The process exits with :attr:`exit_code` (75, ``EX_TEMPFAIL``: "try again"), so a
    scheduler can requeue the job; with ``CHECKPOINT.AUTO_RESUME`` the requeued run
    continues from the checkpoint.
    """

    exit_code = 75


class TrainingInterrupted(VisslError):
    """Training stopped on Ctrl-C (SIGINT) after saving a checkpoint.

    Raised after ``on_end`` when a stop of kind "interrupted" ended training (the first
    Ctrl-C, or ``task.request_stop(reason, kind="interrupted")``). The command line exits
    with :attr:`exit_code` (130 = 128 + SIGINT, the shell's convention for Ctrl-C); running
    it again with ``CHECKPOINT.AUTO_RESUME`` continues from the checkpoint.

    Attributes:
        auto_resume: whether ``CHECKPOINT.AUTO_RESUME`` was on (then the same command
            resumes; otherwise it needs ``config.CHECKPOINT.AUTO_RESUME=true``).
    """

    exit_code = 130

    def __init__(self, message: str, auto_resume: bool = True) -> None:
        super().__init__(message, auto_resume)
        self.auto_resume = auto_resume

    def __str__(self) -> str:
        return str(self.args[0])


class RunFolderError(ConfigError):
    """``CHECKPOINT.DIR`` cannot take this run without losing or mixing another's files.

    Raised before anything in the folder changes: the folder holds a finished run of
    another config, or another live run holds its lock. The message names the folder's
    run and how to start a new one; ``key_path`` is ``config.CHECKPOINT.DIR``.
    """

    def __init__(self, message: str, key_path: str | None = "config.CHECKPOINT.DIR") -> None:
        super().__init__(message, key_path)


class RunFolderLockedError(RunFolderError):
    """Another live run holds the lock of ``CHECKPOINT.DIR`` (the message names it)."""


class ResumeMismatchError(RunFolderError):
    """``CHECKPOINT.AUTO_RESUME`` found a checkpoint of another model in ``CHECKPOINT.DIR``.

    Raised before the folder changes (``train_config.yaml``, ``log.txt`` are untouched);
    the message names the checkpoint's run and how to start a new one.
    """

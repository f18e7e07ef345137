"""Logging set-up: the primary rank logs to stdout and ``log.txt``; others log warnings."""

from __future__ import annotations

import logging
import os
import sys

_FORMAT = "%(levelname)s %(asctime)s %(name)s:%(lineno)d] %(message)s"

#: ``logger.info(..., extra={CONSOLE: False})``: the record goes to ``log.txt`` only (a
#: per-phase table the console does not need every epoch).
CONSOLE = "vissl_console"


def _for_console(record: logging.LogRecord) -> bool:
    return bool(getattr(record, CONSOLE, True))


class _TqdmAwareHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes log lines through an active tqdm progress bar without garbling it.

    The bars drawn on the same terminal are cleared, the line is written *and flushed*,
    then the bars are redrawn (``tqdm.external_write_mode``). Flushing inside that window
    matters when stdout is buffered: a line flushed after the redraw would land after the
    bar, on its line.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = self.format(record) + self.terminator
            # (no import per line: without tqdm imported there is no bar to clear)
            tqdm_std = sys.modules.get("tqdm.std")
            tqdm = getattr(tqdm_std, "tqdm", None)
            if not getattr(tqdm, "_instances", None):  # no bar alive: nothing to clear
                self.stream.write(msg)
                self.flush()
                return
            with tqdm.external_write_mode(file=self.stream):  # type: ignore[union-attr]
                self.stream.write(msg)
                self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


class _SharedFormatter(logging.Formatter):
    """A formatter that formats a record once for all the handlers sharing it (stdout
    and ``log.txt`` get the same text), and the time once per second."""

    _last_time: tuple[int, str | None, str] = (-1, None, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is None:  # the default format shows milliseconds: not cached
            return super().formatTime(record, datefmt)
        second = int(record.created)
        last = self._last_time
        if last[0] == second and last[1] == datefmt:
            return last[2]
        text = super().formatTime(record, datefmt)
        self._last_time = (second, datefmt, text)
        return text

    def format(self, record: logging.LogRecord) -> str:
        cached = record.__dict__.get("_vissl_text")
        if cached is not None and cached[0] == id(self):
            return str(cached[1])
        text = super().format(record)
        record._vissl_text = (id(self), text)  # type: ignore[attr-defined]
        return text


class _PendingLogFile(logging.Handler):
    """Holds the records meant for ``log.txt`` until :func:`start_log_file` writes them.

    A resumed run must not touch its folder before the checkpoint is known to fit (the
    folder may hold another model's run); the console shows the records meanwhile.
    """

    def __init__(self, path: str, formatter: logging.Formatter) -> None:
        super().__init__()
        self.path = path
        self.setFormatter(formatter)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def setup_logging(
    output_dir: str | None, rank: int = 0, verbose: bool = False, defer_file: bool = False
) -> logging.Logger:
    """Configure the ``vissl`` logger for this process (idempotent).

    Args:
        output_dir: the folder of ``log.txt`` (rank 0 only); None: console only.
        rank: this process's global rank (others log warnings and errors only).
        verbose: debug records too.
        defer_file: hold ``log.txt``'s records in memory until :func:`start_log_file`
            (dropped if it is never called): a resume writes nothing in its folder before
            its checkpoint is known to fit.
    """
    logger = logging.getLogger("vissl")
    for handler in list(logger.handlers):
        if getattr(handler, "_vissl", False):
            logger.removeHandler(handler)
            handler.close()
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    fmt = _SharedFormatter(_FORMAT, datefmt="%H:%M:%S")
    stream = _TqdmAwareHandler(sys.stdout)
    stream.setLevel(logging.DEBUG if verbose else logging.INFO if rank == 0 else logging.WARNING)
    stream.setFormatter(fmt)
    stream.addFilter(_for_console)
    stream._vissl = True  # type: ignore[attr-defined]
    logger.addHandler(stream)
    if output_dir and rank == 0:
        path = os.path.join(output_dir, "log.txt")
        if defer_file:
            pending = _PendingLogFile(path, fmt)
            pending._vissl = True  # type: ignore[attr-defined]
            logger.addHandler(pending)
        else:
            _add_file_handler(logger, path, fmt)
    return logger


def _add_file_handler(logger: logging.Logger, path: str, fmt: logging.Formatter) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(fmt)
    file_handler._vissl = True  # type: ignore[attr-defined]
    logger.addHandler(file_handler)


def start_log_file() -> bool:
    """Open the ``log.txt`` that :func:`setup_logging` deferred, and write the records
    held so far into it; whether there was one to open."""
    logger = logging.getLogger("vissl")
    started = False
    for handler in list(logger.handlers):
        if isinstance(handler, _PendingLogFile):
            logger.removeHandler(handler)
            formatter = handler.formatter or logging.Formatter(_FORMAT)
            _add_file_handler(logger, handler.path, formatter)
            new = logger.handlers[-1]
            for record in handler.records:
                new.handle(record)
            handler.close()
            started = True
    return started


def shutdown_logging() -> None:
    logger = logging.getLogger("vissl")
    for handler in list(logger.handlers):
        if getattr(handler, "_vissl", False):
            handler.flush()
            if isinstance(handler, logging.FileHandler | _PendingLogFile):
                logger.removeHandler(handler)
                handler.close()

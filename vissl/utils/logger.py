"""Logging set-up: the primary rank logs to stdout and ``log.txt``; others log warnings."""

from __future__ import annotations

import logging
import os
import sys

_FORMAT = "%(levelname)s %(asctime)s %(name)s:%(lineno)d] %(message)s"


class _TqdmAwareHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes through ``tqdm.write`` so log lines do not break an active progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:
            self.handleError(record)


def setup_logging(output_dir: str | None, rank: int = 0, verbose: bool = False) -> logging.Logger:
    """Configure the ``vissl`` logger for this process (idempotent)."""
    logger = logging.getLogger("vissl")
    for handler in list(logger.handlers):
        if getattr(handler, "_vissl", False):
            logger.removeHandler(handler)
            handler.close()
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    fmt = logging.Formatter(_FORMAT, datefmt="%H:%M:%S")
    stream = _TqdmAwareHandler(sys.stdout)
    stream.setLevel(logging.DEBUG if verbose else logging.INFO if rank == 0 else logging.WARNING)
    stream.setFormatter(fmt)
    stream._vissl = True  # type: ignore[attr-defined]
    logger.addHandler(stream)
    if output_dir and rank == 0:
        os.makedirs(output_dir, exist_ok=True)
        file_handler = logging.FileHandler(os.path.join(output_dir, "log.txt"), encoding="utf-8")
        file_handler.setFormatter(fmt)
        file_handler._vissl = True  # type: ignore[attr-defined]
        logger.addHandler(file_handler)
    return logger


def shutdown_logging() -> None:
    logger = logging.getLogger("vissl")
    for handler in list(logger.handlers):
        if getattr(handler, "_vissl", False):
            handler.flush()
            if isinstance(handler, logging.FileHandler):
                logger.removeHandler(handler)
                handler.close()

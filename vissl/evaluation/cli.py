"""What the evaluation tools (``tools/*.py``) share: their logging, their JSON results, and
how their errors reach the command line."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from vissl.errors import VisslError

logger = logging.getLogger("vissl.tools")


def setup_tool_logging(cfg: Any) -> str:
    """Log to stdout and ``CHECKPOINT.DIR/log.txt``; returns the folder."""
    from vissl.utils.logger import setup_logging

    out_dir = os.path.abspath(str(cfg.CHECKPOINT.DIR))
    setup_logging(out_dir, 0, verbose=bool(cfg.VERBOSE))
    return out_dir


def write_results_json(path: str, data: Any) -> None:
    """Write a tool's results as JSON, atomically (temporary file, then rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def report_layer(
    path: str, report: dict[str, Any], layer: str, summary: dict[str, Any], line: str
) -> None:
    """Add ``layer``'s ``summary`` to ``report["layers"]``, rewrite the results file
    ``path``, and print the layer's result ``line``."""
    report["layers"][layer] = summary
    write_results_json(path, report)
    logger.info("results saved to %s", path)
    print(line, flush=True)


def run_tool(prog: str, main: Callable[[list[str]], int], argv: Sequence[str]) -> int:
    """Run ``main(argv)``; user errors become one ``prog: error: ...`` line on stderr."""
    from vissl.utils.distributed_launcher import DistributedWorkerError

    try:
        return main(list(argv))
    except DistributedWorkerError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1
    except VisslError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2

#!/usr/bin/env python3
"""Plot the training curves of one or several runs into one PNG.

    python tools/plot_metrics.py checkpoints/quick_start --out quick_start_curves.png

``--help`` (or :mod:`vissl.evaluation.plot_metrics`) tells what is read and drawn.
Exit codes: 0 written, 2 a bad input or no matplotlib (one line ``error: ...`` on stderr).
"""

import sys

from vissl.evaluation.plot_metrics import run_cli

if __name__ == "__main__":
    sys.exit(run_cli(sys.argv[1:]))

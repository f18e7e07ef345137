#!/usr/bin/env python3
"""VISSL's name of ``convert_classy_vision_to_vissl.py`` (which see): a ClassyVision
ResNe(X)t (or RegNet) checkpoint -> a file vissl's ``MODEL.WEIGHTS_INIT`` loads.

VISSL's flags work: ``--input_model_file IN --output_model OUT [--depth 50]``.

Exit codes: 0 converted, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import run_script
from convert_classy_vision_to_vissl import main


def _main(argv: Sequence[str] | None) -> int:
    return main(argv, prog="extra_scripts/convert_classy_vision_to_vissl_resnet.py")


if __name__ == "__main__":
    sys.exit(run_script(_main, sys.argv[1:]))

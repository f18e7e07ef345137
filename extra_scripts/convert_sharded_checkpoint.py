#!/usr/bin/env python3
"""Consolidate a sharded checkpoint (``TRAINER.TASK_NAME: self_supervision_fsdp_task``)
into one file in the usual layout.

A sharded checkpoint is an index (``model_phase{N}.torch``) and a DCP folder beside it
(``model_phase{N}.dcp``, one file per rank). The output holds every tensor unsharded:
``classy_state_dict.base_model.model.{trunk,heads}``, the loss state (teachers, queues),
the optimizer state (in torch's layout, by parameter index) and the rest of the index
(iteration, phase, RNG and meter states, config). It loads with
``config.MODEL.WEIGHTS_INIT.PARAMS_FILE=OUT``, in the evaluation tools, in
``convert_vissl_to_torchvision.py``, and resumes a DDP run (``self_supervision_task``) as
any checkpoint does. No process group is needed: it runs on one CPU.

examples:
  python extra_scripts/convert_sharded_checkpoint.py \\
      checkpoints/seer/model_final_checkpoint_phase0.torch seer_final_consolidated.torch
  # the DCP folder may be given instead of its index
  python extra_scripts/convert_sharded_checkpoint.py checkpoints/seer/model_phase3.dcp out.torch

Exit codes: 0 converted, 2 a bad input (one line ``error: ...`` on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# the sibling scripts, also when this file is run by runpy (as the docs checks do)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import HelpFormatter, ScriptError, run_script

from vissl.trainer.sharded_checkpoint import write_consolidated_checkpoint


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument("input", help="the sharded checkpoint's index (.torch) or .dcp folder")
    parser.add_argument("output", help="the consolidated checkpoint to write")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not os.path.exists(args.input):
        raise ScriptError(f"{args.input!r} does not exist.")
    if os.path.abspath(args.input) == os.path.abspath(args.output):
        raise ScriptError("OUTPUT must differ from INPUT (the index would be overwritten).")
    write_consolidated_checkpoint(args.input, args.output)
    print(f"wrote the consolidated checkpoint {args.output}")
    print(f"use it with: config.MODEL.WEIGHTS_INIT.PARAMS_FILE={args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, sys.argv[1:]))

#!/usr/bin/env python3
"""Train (or run another engine) from a config, locally or on SLURM.

    python tools/run_distributed_engines.py config=quick_start \
        [config.SECTION.KEY=value ...] [+config/group/sub=file] [engine_name=train] [node_id=0]

- ``config.DISTRIBUTED.NUM_PROC_PER_NODE=N``: N processes on this machine.
- Several machines: run the command on each with ``node_id=<0..NUM_NODES-1>``,
  ``config.DISTRIBUTED.NUM_NODES`` and ``config.DISTRIBUTED.RUN_ID=<host of node 0>:<port>``.
- ``torchrun --nproc_per_node N tools/run_distributed_engines.py ...``: torchrun's processes
  are used (the config's process counts must match).
- ``config.SLURM.USE_SLURM=true``: submits the job to SLURM through submitit.

Exit codes: 0 done (or submitted), 1 a process failed, 2 a config error,
75 stopped for preemption after a checkpoint (run it again to resume),
130 stopped by Ctrl-C (the first one saves a checkpoint and prints the command that
resumes; a second one aborts at once).
"""

import sys

from vissl.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())

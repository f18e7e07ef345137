#!/usr/bin/env python3
"""Train (or run another engine) from a config.

    python tools/run_distributed_engines.py config=quick_start \
        [config.SECTION.KEY=value ...] [+config/group/sub=file] [engine_name=train] [node_id=0]

Exit codes: 0 done, 2 a config error, 75 stopped for preemption after a checkpoint (run it
again to resume).
"""

from __future__ import annotations

import sys

from vissl.errors import TrainingPreempted, VisslError
from vissl.hooks import default_hook_generator
from vissl.utils.distributed_launcher import launch_distributed
from vissl.utils.hydra_config import hydra_compose_and_validate


def hydra_main(overrides: list[str]) -> None:
    root, config = hydra_compose_and_validate(overrides)
    launch_distributed(
        config,
        node_id=int(root.node_id),
        engine_name=str(root.engine_name),
        hook_generator=default_hook_generator,
    )


def main() -> int:
    try:
        hydra_main(sys.argv[1:])
    except TrainingPreempted as err:
        print(f"vissl: {err}; run the same command again to resume.", file=sys.stderr)
        return TrainingPreempted.exit_code
    except VisslError as err:
        print(f"vissl: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

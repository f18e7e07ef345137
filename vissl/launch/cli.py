"""The command line of ``tools/run_distributed_engines.py``: compose the config, launch
the engine locally or on SLURM, and turn the outcome into the exit code (0 done, 1 a
process failed, 2 a config error, 75 preempted, 130 Ctrl-C); ``main()`` reads
``sys.argv``."""

from __future__ import annotations

import os
import shlex
import shutil
import sys

from vissl.errors import TrainingInterrupted, TrainingPreempted, VisslError
from vissl.hooks import default_hook_generator
from vissl.utils.distributed_launcher import DistributedWorkerError, launch_distributed
from vissl.utils.hydra_config import hydra_compose_and_validate


def hydra_main(overrides: list[str]) -> None:
    root, config = hydra_compose_and_validate(overrides)
    if config.SLURM.USE_SLURM:
        from vissl.utils.slurm import launch_distributed_on_slurm

        launch_distributed_on_slurm(
            config, engine_name=str(root.engine_name), hook_generator=default_hook_generator
        )
        return
    launch_distributed(
        config,
        node_id=int(root.node_id),
        engine_name=str(root.engine_name),
        hook_generator=default_hook_generator,
    )


AUTO_RESUME_KEY = "config.CHECKPOINT.AUTO_RESUME"


def resume_command(argv: list[str], auto_resume: bool) -> str:
    """The command line that resumes this run: the same one, with AUTO_RESUME on."""
    args = list(argv)
    if not auto_resume:
        args = [a for a in args if not a.lstrip("+~").startswith(AUTO_RESUME_KEY + "=")]
        args.append(f"{AUTO_RESUME_KEY}=true")
    found = shutil.which("python")
    python = (
        "python"
        if found and os.path.abspath(found) == os.path.abspath(sys.executable)
        else sys.executable
    )
    return shlex.join([python, sys.argv[0], *args])


def main() -> int:
    try:
        hydra_main(sys.argv[1:])
    except TrainingPreempted as err:
        print(f"vissl: {err}; run the same command again to resume.", file=sys.stderr)
        return TrainingPreempted.exit_code
    except TrainingInterrupted as err:
        print(
            f"vissl: {err}.\nTo resume, run:\n  {resume_command(sys.argv[1:], err.auto_resume)}",
            file=sys.stderr,
        )
        return TrainingInterrupted.exit_code
    except KeyboardInterrupt:
        print("vissl: aborted by Ctrl-C (no checkpoint of the current step).", file=sys.stderr)
        return TrainingInterrupted.exit_code
    except DistributedWorkerError as err:
        print(f"vissl: error: {err}", file=sys.stderr)
        return 1
    except VisslError as err:
        print(f"vissl: error: {err}", file=sys.stderr)
        return 2
    return 0

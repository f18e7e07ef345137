"""Helpers for tests: free ports and multi-process gloo runs on CPU."""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vissl.utils.distributed import find_free_port

__all__ = ["find_free_port", "spawn_gloo"]


def _worker(
    rank: int,
    world_size: int,
    init_file: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        results[rank] = ("ok", fn(rank, world_size, *args))
    except BaseException:
        results[rank] = ("error", traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def spawn_gloo(
    fn: Callable[..., Any], world_size: int = 2, *args: Any, start_method: str = "fork"
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` gloo processes.

    Returns the per-rank return values (they must be picklable). A rank that raises
    makes this raise ``RuntimeError`` with its traceback.
    """
    ctx = mp.get_context(start_method)
    with ctx.Manager() as manager, tempfile.TemporaryDirectory() as tmp:
        results = manager.dict()
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(  # type: ignore[attr-defined]
                target=_worker, args=(r, world_size, init_file, fn, args, results)
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        for p in procs:
            if p.is_alive():
                p.kill()
        errors = [v[1] for v in results.values() if v[0] == "error"]
        if errors or len(results) != world_size:
            raise RuntimeError(
                "distributed test failed:\n" + "\n".join(errors or ["a rank died or hung"])
            )
        return [results[r][1] for r in range(world_size)]

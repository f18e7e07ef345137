"""Instrumented windows of benchmarks/gpu_report.py (``--tiny --device cpu``): what the
trainer and the hand loop do per step between two log steps, counted, never timed.

:func:`measure` runs one variant of one workload with a :class:`Window` subclass of the
report's own that opens and closes the instruments with the measured window:

- ``aten``: ``aten::`` events per step (``torch.profiler``, CPU activity);
- ``python``: Python calls per step (``sys.setprofile``; generator resumes included),
  in total and from vissl's own files;
- ``walks``: outermost calls of ``nn.Module.modules`` / ``named_modules`` /
  ``parameters`` / ``named_parameters`` / ``buffers`` / ``named_buffers`` /
  ``children`` / ``named_children``, by the first caller outside torch;
- ``reads``: host reads of tensors (``item``, ``tolist``, ``cpu``, ``numpy``,
  ``__bool__``, ``__float__``, ``__int__``, ``nonzero``) made from vissl's files.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
from torch import nn

from tests.benchmarks._load import REPO, load_benchmark

VISSL_DIR = os.path.join(REPO, "vissl") + os.sep
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
WALKS = (
    "modules",
    "named_modules",
    "parameters",
    "named_parameters",
    "buffers",
    "named_buffers",
    "children",
    "named_children",
)
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "nonzero")


@dataclass
class HostWork:
    """What one window did, per step (``steps`` steps)."""

    steps: int
    aten: float = float("nan")
    python: float = float("nan")
    python_vissl: float = float("nan")
    walks: Counter[str] = field(default_factory=Counter)
    reads: Counter[str] = field(default_factory=Counter)
    vissl_calls: Counter[str] = field(default_factory=Counter)
    final_loss: float = float("nan")


def _caller(depth: int = 2) -> str:
    """The first frame outside torch and this file: ``path:line``."""
    frame = sys._getframe(depth)
    while frame is not None and (
        frame.f_code.co_filename.startswith(TORCH_DIR) or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    return f"{os.path.relpath(frame.f_code.co_filename, REPO)}:{frame.f_lineno}"


class _Instruments:
    def __init__(self, kind: str, work: HostWork) -> None:
        self.kind = kind
        self.work = work
        self._stack = contextlib.ExitStack()
        self._depth = 0
        self._prof: Any = None
        self._calls = 0
        self._vissl = 0

    def start(self) -> None:
        if "aten" in self.kind:
            self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self._prof.__enter__()
        if "host" not in self.kind:
            return
        for name in WALKS:
            self._patch(nn.Module, name, self._walk_wrapper)
        for name in READS:
            self._patch(torch.Tensor, name, self._read_wrapper)
        sys.setprofile(self._profile)

    def stop(self) -> None:
        if "host" in self.kind:
            sys.setprofile(None)
            self._stack.close()
            self.work.python = self._calls / self.work.steps
            self.work.python_vissl = self._vissl / self.work.steps
        if "aten" in self.kind:
            self._prof.__exit__(None, None, None)
            events = self._prof.events()
            n = sum(1 for e in events if e.name.startswith("aten::"))
            self.work.aten = n / self.work.steps

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        self._calls += 1
        filename = frame.f_code.co_filename
        if filename.startswith(VISSL_DIR):
            self._vissl += 1
            self.work.vissl_calls[f"{os.path.relpath(filename, REPO)}:{frame.f_code.co_name}"] += 1

    def _patch(self, owner: type, name: str, make: Any) -> None:
        own = name in owner.__dict__
        original = owner.__dict__[name] if own else getattr(owner, name)
        setattr(owner, name, make(name, original))
        if own:
            self._stack.callback(setattr, owner, name, original)
        else:
            self._stack.callback(delattr, owner, name)

    def _walk_wrapper(self, name: str, original: Any) -> Any:
        instruments = self

        def walk(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if instruments._depth == 0:
                instruments.work.walks[f"{name} from {_caller()}"] += 1
            instruments._depth += 1
            try:
                # consume generators inside the depth guard (nested walks are torch's)
                result = original(module, *args, **kwargs)
                return iter(list(result)) if isinstance(result, Iterator) else result
            finally:
                instruments._depth -= 1

        return walk

    def _read_wrapper(self, name: str, original: Any) -> Any:
        instruments = self

        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            # the direct caller: torch's own reads (CPU AdamW's step counts) are not ours
            code = sys._getframe(1).f_code
            if code.co_filename.startswith(VISSL_DIR):
                where = f"{os.path.relpath(code.co_filename, REPO)}:{sys._getframe(1).f_lineno}"
                instruments.work.reads[f"{name} from {where}"] += 1
            return original(tensor, *args, **kwargs)

        return read


def bench() -> ModuleType:
    return load_benchmark("gpu_report.py")


def tiny_args(workload: str, warmup: int = 2, steps: int = 2, extra: list[str] | None = None):
    b = bench()
    argv = ["--tiny", "--device", "cpu", "--rounds", "1", "--steps", str(steps),
            "--warmup", str(warmup), "--workers", "0", "--quiet", "--no-spt",
            "--workloads", workload]  # fmt: skip
    for o in extra or []:
        argv += ["--override", o]
    return b.parse_args(argv)


def measure(
    workload: str,
    variant: str,
    kind: str,
    args: Any,
    cfg: Any,
    batch: Any,
) -> HostWork:
    """One run of ``variant`` (``vissl`` or ``hand``) with ``kind`` instruments over its
    window: ``aten`` (op counts), ``host`` (Python calls, module walks, host reads), or
    both (``aten+host``; the profiler calls no Python code per op)."""
    b = bench()
    work = HostWork(args.steps)
    base = b.Window

    class Instrumented(base):  # type: ignore[misc, valid-type]
        def open(self) -> None:
            super().open()
            self._instruments = _Instruments(kind, work)
            self._instruments.start()

        def close(self, loss: Any) -> None:
            self._instruments.stop()
            super().close(loss)

    b.Window = Instrumented
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = b.run_vissl if variant == "vissl" else b.run_hand
        m = run(cfg, args, torch.device("cpu"), batch)
    finally:
        b.Window = base
        torch.set_num_threads(threads)
    work.final_loss = m.final_loss
    return work


def setup(workload: str, folder: str, extra: list[str] | None = None) -> tuple[Any, Any, Any]:
    """(args, cfg, batch) of the tiny ``workload``."""
    b = bench()
    args = tiny_args(workload, extra=extra)
    cfg = b.compose(args, workload, folder)
    batch = b.in_memory_batch(cfg, workload, torch.device("cpu"))
    return args, cfg, batch

"""Monitoring hooks from VISSL's ``HOOKS`` keys: model complexity, GPU stats, memory.

Keys (VISSL's names)::

    HOOKS:
      MODEL_COMPLEXITY:
        COMPUTE_COMPLEXITY: False   # params and FLOPs (fvcore) once, at the start
        INPUT_SHAPE: [3, 224, 224]  # one input image, without the batch dimension
      LOG_GPU_STATS: True           # CUDA memory at the start and every LOG_FREQUENCY iters
      MEMORY_SUMMARY:
        PRINT_MEMORY_SUMMARY: True  # torch.cuda.memory_summary() once, after a train step
        LOG_ITERATION_NUM: 0        # ... the step of this (0-based) train iteration
        DUMP_MEMORY_ON_EXCEPTION: False  # live tensors to memory_dump_rank{r}.txt on failure

The GPU hooks do nothing on a CPU run. None of them reads a value back from the device
during a step: CUDA memory statistics are host-side counters.
"""

from __future__ import annotations

import collections
import gc
import logging
import os
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from vissl.errors import ConfigError
from vissl.hooks.base import Priority, VisslHook
from vissl.models.model_helpers import get_no_ddp_model
from vissl.utils.distributed import get_rank, is_primary

logger = logging.getLogger(__name__)

_MIB = 2**20


def _plain_model(task: Any) -> nn.Module:
    """The model without DDP / ``torch.compile`` wrappers."""
    model: Any = getattr(task, "base_model", None)
    if not isinstance(model, nn.Module) or isinstance(model, nn.Identity):
        model = task.model
    assert isinstance(model, nn.Module), type(model)
    return get_no_ddp_model(model)


def _is_tensor(obj: Any) -> bool:
    try:
        return isinstance(obj, torch.Tensor)
    except Exception:  # proxies whose __class__ raises
        return False


def _on_cuda(task: Any) -> bool:
    device = getattr(task, "device", None)
    return isinstance(device, torch.device) and device.type == "cuda"


class ModelComplexityHook(VisslHook):
    """Log the model's parameter count and FLOPs (fvcore) once, at ``on_start``.

    The model runs once in eval mode on a zero input of ``(1, *input_shape)``; its train
    mode is restored afterwards. A model fvcore cannot trace gives a warning, not a failure.

    Args:
        input_shape: one input without the batch dimension (``MODEL_COMPLEXITY.INPUT_SHAPE``).
    """

    priority = Priority.HIGH

    def __init__(self, input_shape: Sequence[int] = (3, 224, 224)) -> None:
        key = "config.HOOKS.MODEL_COMPLEXITY.INPUT_SHAPE"
        if (
            isinstance(input_shape, str | bytes)
            or not isinstance(input_shape, Sequence)
            or not input_shape
            or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in input_shape
            )
        ):
            raise ConfigError(
                f"{key}={input_shape!r} must be a list of positive integers, e.g. [3, 224, 224].",
                key,
            )
        self.input_shape = [int(d) for d in input_shape]
        #: ``{"params", "trainable_params", "flops"}`` after ``on_start`` (flops -1 if it failed)
        self.result: dict[str, int] = {}

    def on_start(self, task: Any) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fvcore imports deprecated torch.jit APIs
            from fvcore.nn import FlopCountAnalysis

        model = _plain_model(task)
        params = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.result = {"params": params, "trainable_params": trainable, "flops": -1}
        device = next(iter(model.parameters()), torch.empty(0)).device
        x = torch.zeros(1, *self.input_shape, device=device)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tracer deprecations, not the user's
                analysis = FlopCountAnalysis(model, (x,))
                analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
                self.result["flops"] = int(analysis.total())
        except Exception as err:  # a model fvcore cannot trace must not stop training
            logger.warning(
                "model complexity: FLOPs not computed at input %s (%s: %s); set "
                "config.HOOKS.MODEL_COMPLEXITY.INPUT_SHAPE to the model's input shape.",
                self.input_shape,
                type(err).__name__,
                err,
            )
        finally:
            model.train(was_training)
        if is_primary():
            flops = self.result["flops"]
            logger.info(
                "model complexity at input %s: %d parameters (%d trainable), %s",
                [1, *self.input_shape],
                params,
                trainable,
                f"{flops / 1e9:.4f} GFLOPs (fvcore, multiply-adds)" if flops >= 0 else "FLOPs n/a",
            )


class LogGpuStatsHook(VisslHook):
    """Log CUDA memory at the start and at log iterations (``HOOKS.LOG_GPU_STATS``).

    Reads the caching allocator's host-side counters (no device sync); no-op on a CPU.
    """

    priority = Priority.LOW

    def __init__(self) -> None:
        self.enabled = False

    def on_start(self, task: Any) -> None:
        self.enabled = _on_cuda(task) and torch.cuda.is_available()
        if not self.enabled:
            return
        device = task.device
        free, total = torch.cuda.mem_get_info(device)
        logger.info(
            "rank %d: %s, %.0f MiB total, %.0f MiB free",
            get_rank(),
            torch.cuda.get_device_name(device),
            total / _MIB,
            free / _MIB,
        )

    def on_step(self, task: Any) -> None:
        if not self.enabled or not task.is_log_iteration:
            return
        device = task.device
        logger.info(
            "rank %d gpu memory (MiB): allocated %.1f, reserved %.1f, peak allocated %.1f, "
            "peak reserved %.1f",
            get_rank(),
            torch.cuda.memory_allocated(device) / _MIB,
            torch.cuda.memory_reserved(device) / _MIB,
            torch.cuda.max_memory_allocated(device) / _MIB,
            torch.cuda.max_memory_reserved(device) / _MIB,
        )


class LogGpuMemoryHook(VisslHook):
    """``torch.cuda.memory_summary()`` once, after train iteration ``log_iteration_num``.

    ``HOOKS.MEMORY_SUMMARY.PRINT_MEMORY_SUMMARY`` / ``LOG_ITERATION_NUM`` (0: the first
    step). No-op on a CPU.
    """

    priority = Priority.LOW

    def __init__(self, log_iteration_num: int = 0) -> None:
        key = "config.HOOKS.MEMORY_SUMMARY.LOG_ITERATION_NUM"
        if isinstance(log_iteration_num, bool) or not isinstance(log_iteration_num, int):
            raise ConfigError(f"{key}={log_iteration_num!r} must be an integer >= 0.", key)
        if log_iteration_num < 0:
            raise ConfigError(f"{key}={log_iteration_num!r} must be an integer >= 0.", key)
        self.log_iteration_num = log_iteration_num
        self._train_steps = 0
        self.done = False

    def on_step(self, task: Any) -> None:
        if self.done or not task.train:
            return
        step = self._train_steps
        self._train_steps += 1
        if step < self.log_iteration_num:
            return
        self.done = True
        if _on_cuda(task) and torch.cuda.is_available():
            logger.info(
                "rank %d cuda memory after train iteration %d:\n%s",
                get_rank(),
                step,
                torch.cuda.memory_summary(task.device, abbreviated=True),
            )


class DumpMemoryOnException(VisslHook):
    """On failure, write the live tensors (grouped by device, dtype and shape) to a file.

    ``HOOKS.MEMORY_SUMMARY.DUMP_MEMORY_ON_EXCEPTION``: ``memory_dump_rank{r}.txt`` in the
    checkpoint folder, largest groups first; with CUDA, the allocator summary follows.

    Args:
        folder: where the dump goes (the checkpoint folder).
    """

    priority = Priority.HIGHEST

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.path: str | None = None

    def on_exception(self, task: Any) -> None:
        try:
            self.path = self._dump(task)
            logger.error("live tensors written to %s", self.path)
        except Exception as err:  # the original exception matters more
            logger.warning("memory dump failed: %s: %s", type(err).__name__, err)

    def _dump(self, task: Any) -> str:
        groups: dict[tuple[str, str, tuple[int, ...]], list[int]] = collections.defaultdict(
            lambda: [0, 0]
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated torch objects warn on isinstance
            tensors = [obj for obj in gc.get_objects() if _is_tensor(obj)]
        for obj in tensors:
            try:
                if obj.device.type == "meta":
                    continue
                key = (str(obj.device), str(obj.dtype).replace("torch.", ""), tuple(obj.shape))
                entry = groups[key]
                entry[0] += 1
                entry[1] += obj.numel() * obj.element_size()
            except Exception:  # objects that lie about being tensors
                continue
        lines = [f"{'count':>7} {'MiB':>10}  device dtype shape"]
        total = 0
        for (device, dtype, shape), (count, nbytes) in sorted(
            groups.items(), key=lambda kv: kv[1][1], reverse=True
        ):
            total += nbytes
            lines.append(f"{count:>7} {nbytes / _MIB:>10.2f}  {device} {dtype} {list(shape)}")
        lines.insert(0, f"live tensors: {total / _MIB:.2f} MiB (views counted in full)")
        if _on_cuda(task) and torch.cuda.is_available():
            lines += ["", torch.cuda.memory_summary(task.device)]
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"memory_dump_rank{get_rank()}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        return path

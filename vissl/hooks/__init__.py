"""Hooks: the base class, the hook registry and the default hook list.

Attach a hook of your own from config::

    # my_hooks.py, listed in config.IMPORTS
    from vissl.hooks import VisslHook, register_hook

    @register_hook("count_steps")
    class CountSteps(VisslHook):
        def __init__(self, every: int = 1):
            self.every, self.n = every, 0
        def on_step(self, task):
            self.n += 1

    # config
    HOOKS:
      CUSTOM_HOOKS: [{name: count_steps, every: 5, priority: 60}]

or from Python with ``launch_distributed(cfg, hook_generator=...)`` (VISSL's way).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping
from typing import Any

from vissl.errors import ConfigError
from vissl.hooks.base import (
    HOOK_EVENTS,
    ClassyHook,
    HookDispatcher,
    HookPriorityError,
    Priority,
    SSLClassyHookFunctions,
    VisslHook,
    check_priority,
    hook_name,
)
from vissl.utils.registry import Registry

logger = logging.getLogger(__name__)

HOOK_REGISTRY: Registry[Any] = Registry("hook", config_key="config.HOOKS.CUSTOM_HOOKS[].name")


def register_hook(name: str) -> Any:
    """Decorator registering a hook class (or factory) under ``name``."""
    return HOOK_REGISTRY.register(name)


def build_hook(spec: Mapping[str, Any], index: int = 0) -> Any:
    """Build one ``HOOKS.CUSTOM_HOOKS`` entry: ``{name, [priority], **kwargs}``.

    Raises:
        HookPriorityError: ``priority`` is not a number.
        ConfigError: arguments the hook does not take.
    """
    kwargs = {k: v for k, v in dict(spec).items() if k not in ("name", "priority")}
    priority = None
    if "priority" in spec:
        priority = check_priority(
            spec["priority"],
            f"hook {spec['name']!r}",
            f"config.HOOKS.CUSTOM_HOOKS[{index}].priority",
        )
    factory = HOOK_REGISTRY.get(spec["name"])
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as err:
        raise ConfigError(
            f"config.HOOKS.CUSTOM_HOOKS[{index}] ({spec['name']!r}): {err}. Its arguments are "
            f"{inspect.signature(factory)}.",
            f"config.HOOKS.CUSTOM_HOOKS[{index}]",
        ) from err
    except ValueError:
        pass  # no signature available (builtins); let the call report errors
    hook = factory(**kwargs)
    if priority is not None:
        hook.priority = priority
    return hook


#: ``HOOKS.TENSORBOARD_SETUP.EXPERIMENT_LOG_DIR`` when it is null or empty.
DEFAULT_TENSORBOARD_DIR = "tensorboard"


def build_monitoring_hooks(cfg: Any) -> list[Any]:
    """The hooks of ``HOOKS.MODEL_COMPLEXITY``, ``LOG_GPU_STATS`` and ``MEMORY_SUMMARY``.

    The GPU memory hooks are added for ``MACHINE.DEVICE: gpu`` only (and do nothing if
    the run ends up on a CPU).
    """
    from vissl.hooks.monitoring_hooks import (
        DumpMemoryOnException,
        LogGpuMemoryHook,
        LogGpuStatsHook,
        ModelComplexityHook,
    )

    hooks_cfg = cfg.HOOKS
    memory = hooks_cfg.MEMORY_SUMMARY
    on_gpu = str(cfg.MACHINE.DEVICE) == "gpu"
    hooks: list[Any] = []
    if hooks_cfg.MODEL_COMPLEXITY.COMPUTE_COMPLEXITY:
        hooks.append(ModelComplexityHook(list(hooks_cfg.MODEL_COMPLEXITY.INPUT_SHAPE)))
    if hooks_cfg.LOG_GPU_STATS and on_gpu:
        hooks.append(LogGpuStatsHook())
    if memory.PRINT_MEMORY_SUMMARY and on_gpu:
        hooks.append(LogGpuMemoryHook(memory.LOG_ITERATION_NUM))
    if memory.DUMP_MEMORY_ON_EXCEPTION:
        hooks.append(DumpMemoryOnException(cfg.CHECKPOINT.DIR))
    return hooks


def default_hook_generator(cfg: Any) -> list[Any]:
    """The default hooks for a config (``cfg`` is the ``config`` section).

    The order in this list is the tie-break among equal priorities; priorities decide
    first (see each class): the NaN check runs before anything that reads the loss or
    saves state; perf timers start before the step; logging and TensorBoard read the
    state after; checkpoints are written last at phase end.
    """
    from vissl.hooks.checkpoint_hooks import CheckpointHook, LogMetricsHook
    from vissl.hooks.ema_hook import EmaHook, ema_enabled
    from vissl.hooks.grad_clip_hooks import GradClipHook
    from vissl.hooks.log_hooks import LogLossLrEtaHook, LogPerfTimeMetricsHook
    from vissl.hooks.online_monitors import build_online_monitor_hooks
    from vissl.hooks.state_update_hooks import (
        CheckNanLossHook,
        FreezeParametersHook,
        parse_frozen_params_map,
    )
    from vissl.hooks.tensorboard_hook import SSLTensorboardHook

    folder = cfg.CHECKPOINT.DIR
    hooks: list[Any] = []
    if cfg.HOOKS.CHECK_NAN:
        hooks.append(CheckNanLossHook(window=int(cfg.LOG_FREQUENCY), dump_folder=folder))
    if cfg.HOOKS.PERF_STATS.MONITOR_PERF_STATS:
        perf = cfg.HOOKS.PERF_STATS
        hooks.append(
            LogPerfTimeMetricsHook(
                int(perf.PERF_STAT_FREQUENCY),
                print_every_phase=bool(perf.get("PRINT_EVERY_PHASE", False)),
            )
        )
    frozen = parse_frozen_params_map(list(cfg.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP or []))
    clip = (
        GradClipHook.from_config(cfg.MODEL.GRAD_CLIP) if cfg.MODEL.GRAD_CLIP.USE_GRAD_CLIP else None
    )
    # Both on_backward, in this order. VISSL drops the frozen gradients, then clips the
    # rest together (global); DINO, iBOT and DINOv2 clip first (DINOv2's dino_head norm
    # counts the last layer's gradient while that layer is frozen), then discard them.
    if clip is not None and clip.mode != "global":
        hooks.append(clip)
    if frozen:
        hooks.append(FreezeParametersHook(frozen))
    if clip is not None and clip.mode == "global":
        hooks.append(clip)
    if ema_enabled(cfg.HOOKS.EMA_MODEL):
        # priority LOW + 5: its on_update follows hooks that edit the weights after the step
        hooks.append(EmaHook.from_config(cfg))
    # HOOKS.ONLINE_KNN, ONLINE_LINEAR_PROBE, COLLAPSE_MONITOR (priority NORMAL - 5)
    hooks.extend(build_online_monitor_hooks(cfg))
    hooks.append(
        LogLossLrEtaHook(
            folder,
            progress_bar=bool(cfg.HOOKS.PROGRESS_BAR),
            rolling_btime_freq=int(cfg.HOOKS.PERF_STATS.ROLLING_BTIME_FREQ),
        )
    )
    hooks.extend(build_monitoring_hooks(cfg))
    tb = cfg.HOOKS.TENSORBOARD_SETUP
    if tb.USE_TENSORBOARD:
        # VISSL's configs often carry null here, meaning the default folder.
        base = folder if tb.LOG_DIR in (None, "", ".") else tb.LOG_DIR
        experiment = tb.EXPERIMENT_LOG_DIR or DEFAULT_TENSORBOARD_DIR
        hooks.append(
            SSLTensorboardHook(
                os.path.join(base, experiment),
                log_params=bool(tb.LOG_PARAMS),
                log_params_gradients=bool(tb.LOG_PARAMS_GRADIENTS),
                log_params_every_n_iters=int(tb.LOG_PARAMS_EVERY_N_ITERS),
                flush_every_n_min=float(tb.FLUSH_EVERY_N_MIN),
            )
        )
    prof = cfg.PROFILING
    if prof.RUNTIME_PROFILING.USE_PROFILER or prof.MEMORY_PROFILING.TRACK_BY_LAYER_MEMORY:
        from vissl.hooks.profiling_hook import ProfilingHook

        hooks.append(ProfilingHook.from_config(cfg, folder))
    hooks.append(LogMetricsHook(folder))
    if cfg.HOOKS.EARLY_STOPPING.ENABLE:
        from vissl.hooks.early_stopping_hook import EarlyStoppingHook

        # priority LOW + 5: after metrics.json is written, before the phase checkpoint
        hooks.append(EarlyStoppingHook.from_config(cfg))
    if cfg.HOOKS.SUMMARY.ENABLE:
        from vissl.hooks.summary_hook import TrainingSummaryHook

        # priority LOW - 5: writes TensorBoard's HPARAMS view before the writer closes
        hooks.append(TrainingSummaryHook(folder, hparams=bool(cfg.HOOKS.SUMMARY.HPARAMS)))
    hooks.append(
        CheckpointHook(
            folder,
            phase_frequency=int(cfg.CHECKPOINT.CHECKPOINT_FREQUENCY),
            iter_frequency=int(cfg.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY),
            keep_last=int(cfg.CHECKPOINT.KEEP_LAST_N_CHECKPOINTS),
        )
    )
    for i, spec in enumerate(cfg.HOOKS.CUSTOM_HOOKS):
        hooks.append(build_hook(spec, i))
    return hooks


__all__ = [
    "HOOK_EVENTS",
    "HOOK_REGISTRY",
    "ClassyHook",
    "HookDispatcher",
    "HookPriorityError",
    "Priority",
    "SSLClassyHookFunctions",
    "VisslHook",
    "build_hook",
    "build_monitoring_hooks",
    "default_hook_generator",
    "hook_name",
    "register_hook",
]

"""``ProfilingHook``: ``torch.profiler`` over a window of train iterations (``config.PROFILING``).

Keys (VISSL's names)::

    PROFILING:
      START_ITERATION: 0          # train iterations before the profiler does anything
      WARMUP_ITERATIONS: 0        # then iterations profiled but discarded (warm caches)
      NUM_ITERATIONS: 10          # then iterations recorded
      STOP_TRAINING_AFTER_PROFILING: False
      OUTPUT_FOLDER: "."          # "." = the checkpoint folder
      PROFILED_RANKS: [0, 1]      # other ranks do not profile
      MEMORY_PROFILING:
        TRACK_BY_LAYER_MEMORY: False   # profile_memory + record_shapes (+ memory timeline)
      RUNTIME_PROFILING:
        USE_PROFILER: False
        PROFILE_CPU: True
        PROFILE_GPU: True         # CUDA kernels, when training on a GPU
        LEGACY_PROFILER: False    # ignored (torch.autograd.profiler); a warning says so

The recorded window is train iterations ``START_ITERATION + WARMUP_ITERATIONS + 1`` to
``START_ITERATION + WARMUP_ITERATIONS + NUM_ITERATIONS`` (1-based, as ``task.iteration``
after the step; a resumed run already past ``START_ITERATION`` starts the window at once).
Each iteration is one ``ProfilerStep#N`` in the trace and includes its ``on_step`` hooks.
When the window closes, each rank in ``PROFILED_RANKS`` writes to the output folder:

- ``profiler_trace_rank{r}.json``: a Chrome trace (chrome://tracing, Perfetto,
  TensorBoard's profiler plugin);
- ``profiler_summary_rank{r}.txt``: ``key_averages()`` tables sorted by self CPU time and,
  on CUDA, self CUDA time (and by memory with ``TRACK_BY_LAYER_MEMORY``);
- with ``TRACK_BY_LAYER_MEMORY``: ``profiler_memory_timeline_rank{r}.json`` where
  torch can build it (``export_memory_timeline``), else only the memory tables.

``STOP_TRAINING_AFTER_PROFILING`` sets ``task.stop_training = True`` (and
``task.stop_training_reason``) on *every* rank right after the window, so that the
trainer can end the run at the same iteration everywhere; training goes on if the
trainer does not honour the flag. Add the hook only when :meth:`ProfilingHook.is_enabled`
is true: a run without profiling then pays nothing.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from vissl.errors import ConfigError, UnsupportedConfigWarning
from vissl.hooks.base import Priority, VisslHook
from vissl.utils.distributed import get_rank

if TYPE_CHECKING:
    from vissl.trainer.task import SelfSupervisionTask

logger = logging.getLogger(__name__)

_KEY = "config.PROFILING"


def _non_negative_int(value: Any, key: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}={value!r} must be an integer >= {minimum}.", key)
    return value


class ProfilingHook(VisslHook):
    """Profile a window of train iterations with ``torch.profiler`` (see the module doc).

    Args:
        output_folder: where the trace and summary files go (created when written).
        start_iteration: train iterations before the profiler starts.
        warmup_iterations: iterations profiled and discarded before recording.
        num_iterations: iterations recorded (>= 1).
        profiled_ranks: ranks that profile; the others only keep count.
        profile_cpu: record CPU activity.
        profile_gpu: record CUDA activity when training on a CUDA device.
        track_memory: ``profile_memory``, ``record_shapes`` and a memory timeline.
        stop_training_after_profiling: set ``task.stop_training`` after the window.
        rank: this process's rank; default: the process group's rank, read at ``on_start``.
        row_limit: rows per summary table.

    Raises:
        ConfigError: a bad value, naming its ``config.PROFILING`` key.
    """

    # Steps the profiler after every other hook's on_step, so that each ProfilerStep
    # covers one whole iteration, hooks included.
    priority = Priority.LOWEST

    def __init__(
        self,
        output_folder: str,
        *,
        start_iteration: int = 0,
        warmup_iterations: int = 0,
        num_iterations: int = 10,
        profiled_ranks: Iterable[int] = (0, 1),
        profile_cpu: bool = True,
        profile_gpu: bool = True,
        track_memory: bool = False,
        stop_training_after_profiling: bool = False,
        rank: int | None = None,
        row_limit: int = 50,
    ) -> None:
        self.output_folder = str(output_folder)
        self.start_iteration = _non_negative_int(start_iteration, f"{_KEY}.START_ITERATION")
        self.warmup_iterations = _non_negative_int(warmup_iterations, f"{_KEY}.WARMUP_ITERATIONS")
        self.num_iterations = _non_negative_int(num_iterations, f"{_KEY}.NUM_ITERATIONS", 1)
        if isinstance(profiled_ranks, str | bytes) or not isinstance(profiled_ranks, Iterable):
            raise ConfigError(
                f"{_KEY}.PROFILED_RANKS={profiled_ranks!r} must be a list of ranks, e.g. [0].",
                f"{_KEY}.PROFILED_RANKS",
            )
        self.profiled_ranks = frozenset(
            _non_negative_int(r, f"{_KEY}.PROFILED_RANKS") for r in profiled_ranks
        )
        if not (profile_cpu or profile_gpu or track_memory):
            raise ConfigError(
                f"{_KEY}.RUNTIME_PROFILING.PROFILE_CPU and PROFILE_GPU are both False: nothing "
                "to profile. Set PROFILE_CPU=True (or turn the profiler off with "
                "USE_PROFILER=False).",
                f"{_KEY}.RUNTIME_PROFILING.PROFILE_CPU",
            )
        self.profile_cpu = bool(profile_cpu)
        self.profile_gpu = bool(profile_gpu)
        self.track_memory = bool(track_memory)
        self.stop_training_after_profiling = bool(stop_training_after_profiling)
        self.rank = rank
        self.row_limit = int(row_limit)
        self.written: list[str] = []
        self._profiler: Any = None
        self._stop_at = -1  # absolute train iteration that closes the window
        self._skip = 0
        self._done = False
        self._use_cuda = False

    # ------------------------------------------------------------------ config
    @staticmethod
    def is_enabled(profiling_config: Mapping[str, Any]) -> bool:
        """Whether ``config.PROFILING`` asks for any profiling (VISSL's rule)."""
        runtime = profiling_config.get("RUNTIME_PROFILING", {}) or {}
        memory = profiling_config.get("MEMORY_PROFILING", {}) or {}
        return bool(runtime.get("USE_PROFILER", False)) or bool(
            memory.get("TRACK_BY_LAYER_MEMORY", False)
        )

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], checkpoint_folder: str) -> ProfilingHook:
        """Build the hook from the ``config`` section; ``OUTPUT_FOLDER: "."`` is the
        checkpoint folder."""
        p = cfg["PROFILING"]
        runtime = p.get("RUNTIME_PROFILING", {}) or {}
        memory = p.get("MEMORY_PROFILING", {}) or {}
        if runtime.get("LEGACY_PROFILER", False):
            warnings.warn(
                f"{_KEY}.RUNTIME_PROFILING.LEGACY_PROFILER=True is ignored: vissl always "
                "uses torch.profiler. Set it to False to silence this warning.",
                UnsupportedConfigWarning,
                stacklevel=2,
            )
        folder = p.get("OUTPUT_FOLDER", ".")
        if not isinstance(folder, str):
            raise ConfigError(
                f"{_KEY}.OUTPUT_FOLDER={folder!r} must be a path ('.' = checkpoint folder).",
                f"{_KEY}.OUTPUT_FOLDER",
            )
        return cls(
            checkpoint_folder if folder in ("", ".") else folder,
            start_iteration=p.get("START_ITERATION", 0),
            warmup_iterations=p.get("WARMUP_ITERATIONS", 0),
            num_iterations=p.get("NUM_ITERATIONS", 10),
            profiled_ranks=p.get("PROFILED_RANKS", [0, 1]),
            profile_cpu=bool(runtime.get("PROFILE_CPU", True)),
            profile_gpu=bool(runtime.get("PROFILE_GPU", True)),
            track_memory=bool(memory.get("TRACK_BY_LAYER_MEMORY", False)),
            stop_training_after_profiling=bool(p.get("STOP_TRAINING_AFTER_PROFILING", False)),
        )

    # ------------------------------------------------------------------ events
    def on_start(self, task: SelfSupervisionTask) -> None:
        if self.rank is None:
            self.rank = get_rank()
        first = int(task.iteration)
        self._skip = max(0, self.start_iteration - first)
        self._stop_at = first + self._skip + self.warmup_iterations + self.num_iterations
        if self.rank in self.profiled_ranks:
            logger.info(
                "profiling train iterations %d-%d on rank %d into %s",
                self._stop_at - self.num_iterations + 1,
                self._stop_at,
                self.rank,
                self.output_folder,
            )

    def on_phase_start(self, task: SelfSupervisionTask) -> None:
        if (
            task.train
            and not self._done
            and self._profiler is None
            and self.rank in self.profiled_ranks
        ):
            self._start(task)

    def on_step(self, task: SelfSupervisionTask) -> None:
        if not task.train or self._done:
            return
        if self._profiler is not None:
            self._profiler.step()
        if task.iteration >= self._stop_at:
            self._finish()
            if self.stop_training_after_profiling:
                task.stop_training = True
                task.stop_training_reason = (
                    f"{_KEY}.STOP_TRAINING_AFTER_PROFILING after iteration {task.iteration}"
                )
                logger.info(
                    "profiling done: requesting the trainer to stop (%s)",
                    task.stop_training_reason,
                )

    def on_end(self, task: SelfSupervisionTask) -> None:
        if not self._done and self._profiler is not None:
            logger.warning(
                "training ended before the profiling window closed (iteration %d of %d); "
                "writing what was recorded, if anything.",
                task.iteration,
                self._stop_at,
            )
        self._finish()

    def on_exception(self, task: SelfSupervisionTask) -> None:
        try:
            self._finish()
        except Exception:  # never hide the training error
            logger.exception("could not stop the profiler after the training error")

    # ------------------------------------------------------------------ profiler
    def _activities(self, task: SelfSupervisionTask) -> list[ProfilerActivity]:
        activities = []
        if self.profile_cpu or self.track_memory:
            activities.append(ProfilerActivity.CPU)
        self._use_cuda = self.profile_gpu and getattr(task.device, "type", "cpu") == "cuda"
        if self._use_cuda:
            activities.append(ProfilerActivity.CUDA)
        elif self.profile_gpu and not activities:
            logger.warning(
                "%s.RUNTIME_PROFILING.PROFILE_GPU=True but training runs on %s: profiling "
                "the CPU instead.",
                _KEY,
                getattr(task.device, "type", "cpu"),
            )
            activities.append(ProfilerActivity.CPU)
        return activities

    def _start(self, task: SelfSupervisionTask) -> None:
        # A profiler step is one train iteration; the window is counted from here.
        with warnings.catch_warnings():
            # torch warns when warmup is 0; WARMUP_ITERATIONS: 0 is a valid choice.
            warnings.filterwarnings("ignore", message=".*warmup.*")
            window = schedule(
                skip_first=self._skip,
                wait=0,
                warmup=self.warmup_iterations,
                active=self.num_iterations,
                repeat=1,
            )
        self._profiler = profile(
            activities=self._activities(task),
            schedule=window,
            on_trace_ready=self._write,
            record_shapes=self.track_memory,
            profile_memory=self.track_memory,
            with_stack=self.track_memory,
        )
        self._profiler.start()

    def _finish(self) -> None:
        """Stop the profiler (writing a partial window if it was recording)."""
        self._done = True
        prof, self._profiler = self._profiler, None
        if prof is not None:
            prof.stop()

    def _path(self, kind: str, suffix: str) -> str:
        return os.path.join(self.output_folder, f"profiler_{kind}_rank{self.rank}{suffix}")

    def _write(self, prof: Any) -> None:
        """``on_trace_ready``: the Chrome trace, the summary tables, the memory timeline."""
        os.makedirs(self.output_folder, exist_ok=True)
        trace = self._path("trace", ".json")
        prof.export_chrome_trace(trace)
        self.written.append(trace)

        averages = prof.key_averages()
        sections = [("self CPU time", "self_cpu_time_total")]
        if self._use_cuda:
            sections.append(("self CUDA time", "self_device_time_total"))
        if self.track_memory:
            sections.append(("self CPU memory", "self_cpu_memory_usage"))
            if self._use_cuda:
                sections.append(("self CUDA memory", "self_device_memory_usage"))
        parts = [
            f"torch.profiler summary, rank {self.rank}, train iterations "
            f"{self._stop_at - self.num_iterations + 1}-{self._stop_at}\n"
        ]
        for title, key in sections:
            table = averages.table(sort_by=key, row_limit=self.row_limit)
            parts.append(f"== sorted by {title} ==\n{table}\n")
        summary = self._path("summary", ".txt")
        with open(summary, "w", encoding="utf-8") as f:
            f.write("\n".join(parts))
        self.written.append(summary)

        if self.track_memory:
            self._write_memory_timeline(prof)
        logger.info("profiler output: %s", ", ".join(self.written))

    def _write_memory_timeline(self, prof: Any) -> None:
        path = self._path("memory_timeline", ".json")
        device = f"cuda:{torch.cuda.current_device()}" if self._use_cuda else "cpu"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # deprecated, still the tool
                prof.export_memory_timeline(path, device=device)
        except Exception as err:  # optional output: the memory tables are in the summary
            logger.warning("no memory timeline (%s: %s); see the memory tables", type(err), err)
            return
        if os.path.exists(path):
            self.written.append(path)


def load_trace_events(path: str) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a Chrome trace written by the hook (for tests and tools)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    return list(events)

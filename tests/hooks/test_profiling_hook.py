"""ProfilingHook: the PROFILING keys drive a torch.profiler window; files per profiled rank."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.integration._runs import run_config
from vissl.errors import ConfigError
from vissl.hooks import default_hook_generator
from vissl.hooks.profiling_hook import ProfilingHook, load_trace_events
from vissl.utils.hydra_config import hydra_compose_and_validate


def _fake_task() -> SimpleNamespace:
    return SimpleNamespace(iteration=0, train=True, device=torch.device("cpu"))


def _train(hook: ProfilingHook, task: Any, iterations: int) -> None:
    """What the trainer does around the hook, with a labelled op per iteration."""
    hook.on_start(task)
    hook.on_phase_start(task)
    x = torch.ones(8, 8)
    for it in range(1, iterations + 1):
        with torch.profiler.record_function(f"vissl_test_iter{it}"):
            x = (x @ x).tanh()
        task.iteration = it
        hook.on_step(task)
        if getattr(task, "stop_training", False):
            break
    hook.on_end(task)


def _labels(trace: str) -> set[str]:
    return {
        e.get("name", "")
        for e in load_trace_events(trace)
        if "vissl_test_iter" in e.get("name", "")
    }


def test_window_is_start_plus_warmup_then_num_iterations(tmp_path):
    hook = ProfilingHook(
        str(tmp_path),
        start_iteration=2,
        warmup_iterations=1,
        num_iterations=2,
        rank=0,
        profiled_ranks=[0],
    )
    _train(hook, _fake_task(), 8)
    trace = tmp_path / "profiler_trace_rank0.json"
    summary = tmp_path / "profiler_summary_rank0.txt"
    assert trace.is_file() and summary.is_file()
    # iterations 1-2 skipped, 3 warm-up, 4-5 recorded
    assert _labels(str(trace)) == {"vissl_test_iter4", "vissl_test_iter5"}
    text = summary.read_text()
    assert "sorted by self CPU time" in text and "Self CPU" in text and "aten::" in text
    assert "iterations 4-5" in text


def test_rank_not_profiled_writes_nothing_but_keeps_the_stop_in_step(tmp_path):
    hook = ProfilingHook(
        str(tmp_path / "out"),
        num_iterations=2,
        profiled_ranks=[0],
        rank=1,
        stop_training_after_profiling=True,
    )
    task = _fake_task()
    _train(hook, task, 6)
    assert not (tmp_path / "out").exists()
    assert hook.written == []
    # every rank stops at the same iteration, profiled or not
    assert task.stop_training is True and task.iteration == 2


def test_stop_training_flag_after_the_window(tmp_path):
    hook = ProfilingHook(
        str(tmp_path),
        start_iteration=1,
        num_iterations=2,
        rank=0,
        profiled_ranks=[0],
        stop_training_after_profiling=True,
    )
    task = _fake_task()
    _train(hook, task, 10)
    assert task.stop_training is True and task.iteration == 3
    assert "STOP_TRAINING_AFTER_PROFILING" in task.stop_training_reason
    assert (tmp_path / "profiler_trace_rank0.json").is_file()


def test_no_stop_flag_by_default(tmp_path):
    task = _fake_task()
    _train(ProfilingHook(str(tmp_path), num_iterations=1, rank=0), task, 3)
    assert not hasattr(task, "stop_training")


def test_training_shorter_than_the_window_writes_the_partial_window(tmp_path):
    hook = ProfilingHook(str(tmp_path), num_iterations=10, rank=0)
    _train(hook, _fake_task(), 3)
    assert _labels(str(tmp_path / "profiler_trace_rank0.json")) == {
        "vissl_test_iter1",
        "vissl_test_iter2",
        "vissl_test_iter3",
    }


def test_memory_tracking_adds_memory_tables(tmp_path):
    hook = ProfilingHook(str(tmp_path), num_iterations=2, rank=0, track_memory=True)
    _train(hook, _fake_task(), 3)
    text = (tmp_path / "profiler_summary_rank0.txt").read_text()
    assert "sorted by self CPU memory" in text and "CPU Mem" in text
    timeline = tmp_path / "profiler_memory_timeline_rank0.json"
    if timeline.exists():  # optional: where torch can build it
        json.loads(timeline.read_text())


def test_test_phases_do_not_advance_the_window(tmp_path):
    hook = ProfilingHook(str(tmp_path), start_iteration=1, num_iterations=1, rank=0)
    task = _fake_task()
    hook.on_start(task)
    hook.on_phase_start(task)
    task.iteration = 1
    hook.on_step(task)
    task.train = False  # a test phase: local iterations, no profiler steps
    for _ in range(5):
        hook.on_step(task)
    assert hook.written == []
    task.train = True
    with torch.profiler.record_function("vissl_test_iter2"):
        torch.ones(4).sum()
    task.iteration = 2
    hook.on_step(task)
    assert _labels(str(tmp_path / "profiler_trace_rank0.json")) == {"vissl_test_iter2"}


# ---------------------------------------------------------------------- config
def _cfg(*overrides: str) -> Any:
    _, cfg = hydra_compose_and_validate(["config=test/cpu_test/tiny_simclr", *overrides])
    return cfg


def test_off_by_default_and_enabled_by_either_key():
    assert not ProfilingHook.is_enabled(_cfg().PROFILING)
    assert ProfilingHook.is_enabled(
        _cfg("config.PROFILING.RUNTIME_PROFILING.USE_PROFILER=True").PROFILING
    )
    assert ProfilingHook.is_enabled(
        _cfg("config.PROFILING.MEMORY_PROFILING.TRACK_BY_LAYER_MEMORY=True").PROFILING
    )


def test_from_config_reads_the_keys(tmp_path):
    cfg = _cfg(
        "config.PROFILING.START_ITERATION=3",
        "config.PROFILING.WARMUP_ITERATIONS=2",
        "config.PROFILING.NUM_ITERATIONS=4",
        "config.PROFILING.PROFILED_RANKS=[1]",
        "config.PROFILING.STOP_TRAINING_AFTER_PROFILING=True",
        "config.PROFILING.MEMORY_PROFILING.TRACK_BY_LAYER_MEMORY=True",
    )
    hook = ProfilingHook.from_config(cfg, str(tmp_path))
    assert hook.output_folder == str(tmp_path)  # "." is the checkpoint folder
    assert (hook.start_iteration, hook.warmup_iterations, hook.num_iterations) == (3, 2, 4)
    assert hook.profiled_ranks == {1} and hook.track_memory and hook.stop_training_after_profiling
    other = ProfilingHook.from_config(
        _cfg(f"config.PROFILING.OUTPUT_FOLDER={tmp_path / 'prof'}"), "/unused"
    )
    assert other.output_folder == str(tmp_path / "prof")


def test_legacy_profiler_is_ignored_with_a_warning(tmp_path):
    cfg = _cfg("config.PROFILING.RUNTIME_PROFILING.LEGACY_PROFILER=True")
    with pytest.warns(UserWarning, match="LEGACY_PROFILER"):
        ProfilingHook.from_config(cfg, str(tmp_path))


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"start_iteration": -1}, "config.PROFILING.START_ITERATION"),
        ({"warmup_iterations": 1.5}, "config.PROFILING.WARMUP_ITERATIONS"),
        ({"num_iterations": 0}, "config.PROFILING.NUM_ITERATIONS"),
        ({"profiled_ranks": "0"}, "config.PROFILING.PROFILED_RANKS"),
        ({"profiled_ranks": [0, -2]}, "config.PROFILING.PROFILED_RANKS"),
        (
            {"profile_cpu": False, "profile_gpu": False},
            "config.PROFILING.RUNTIME_PROFILING.PROFILE_CPU",
        ),
    ],
)
def test_bad_values_name_their_key(kwargs, key):
    with pytest.raises(ConfigError) as err:
        ProfilingHook("/tmp/unused", **kwargs)
    assert err.value.key_path == key
    assert key.rsplit(".", 1)[-1] in str(err.value)


# ---------------------------------------------------------------------- end to end
def _with_profiler(cfg: Any) -> list[Any]:
    hooks = default_hook_generator(cfg)
    if not any(isinstance(h, ProfilingHook) for h in hooks):
        hooks.append(ProfilingHook.from_config(cfg, cfg.CHECKPOINT.DIR))
    return hooks


@pytest.mark.integration
def test_tiny_config_writes_trace_and_summary(tmp_path):
    folder = tmp_path / "run"
    run_config(
        "test/cpu_test/tiny_simclr",
        f"config.CHECKPOINT.DIR={folder}",
        "config.OPTIMIZER.num_epochs=1",
        "config.PROFILING.RUNTIME_PROFILING.USE_PROFILER=True",
        "config.PROFILING.START_ITERATION=1",
        "config.PROFILING.NUM_ITERATIONS=3",
        "config.PROFILING.PROFILED_RANKS=[0]",
        hook_generator=_with_profiler,
    )
    trace = folder / "profiler_trace_rank0.json"
    summary = folder / "profiler_summary_rank0.txt"
    assert trace.is_file() and summary.is_file()
    events = load_trace_events(str(trace))
    assert events, "the trace has no events"
    steps = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert len(steps) == 3, steps
    assert any(e.get("name", "").startswith("aten::convolution") for e in events)
    assert "aten::" in summary.read_text()
    assert os.path.exists(folder / "model_final_checkpoint_phase0.torch")


@pytest.mark.integration
def test_profiler_from_config_writes_trace_and_stops(tmp_path):
    from tests.integration._runs import run_config

    task = run_config(
        "test/cpu_test/tiny_simclr",
        "config.PROFILING.RUNTIME_PROFILING.USE_PROFILER=True",
        "config.PROFILING.START_ITERATION=1",
        "config.PROFILING.NUM_ITERATIONS=2",
        "config.PROFILING.STOP_TRAINING_AFTER_PROFILING=True",
        f"config.CHECKPOINT.DIR={tmp_path}",
    )
    assert (tmp_path / "profiler_trace_rank0.json").exists()
    assert (tmp_path / "profiler_summary_rank0.txt").exists()
    assert task.stop_training and task.iteration < task.max_iteration

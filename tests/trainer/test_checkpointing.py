"""The checkpointing home: the resume choice by recorded progress, fallback, contents."""

from __future__ import annotations

import os
import time

from vissl.trainer.checkpointing import find_resume_checkpoint
from vissl.utils.checkpoint import has_final_checkpoint, list_checkpoints, save_checkpoint


def _progress(iteration: int, phase_idx: int, complete: bool = True) -> dict:
    return {
        "iteration": iteration,
        "phase_idx": phase_idx,
        "classy_state_dict": {"phase_complete": complete},
    }


def test_resume_lookup_and_final_detection(tmp_path):
    assert find_resume_checkpoint(str(tmp_path)) is None
    save_checkpoint(str(tmp_path), "model_phase0.torch", _progress(5, 0))
    save_checkpoint(str(tmp_path), "model_iteration7.torch", _progress(7, 1, False))
    assert [k for k, _, _ in list_checkpoints(str(tmp_path))] == ["phase", "iteration"]
    assert find_resume_checkpoint(str(tmp_path)).endswith("model_iteration7.torch")
    assert find_resume_checkpoint(str(tmp_path), 2).endswith("model_phase0.torch")
    assert not has_final_checkpoint(str(tmp_path))
    save_checkpoint(str(tmp_path), "model_final_checkpoint_phase1.torch", _progress(10, 1))
    assert has_final_checkpoint(str(tmp_path))


def test_resume_follows_recorded_progress_not_file_times(tmp_path):
    """An older checkpoint touched to be the newest by mtime (a copy without -p, clock
    skew on a shared file system) is still older: the resume picks the highest iteration."""
    folder = str(tmp_path)
    save_checkpoint(folder, "model_iteration2.torch", _progress(2, 0, False))
    save_checkpoint(folder, "model_phase0.torch", _progress(4, 0))
    save_checkpoint(folder, "model_iteration6.torch", _progress(6, 1, False))
    future = time.time() + 3600
    os.utime(tmp_path / "model_iteration2.torch", (future, future))
    os.utime(tmp_path / "model_phase0.torch", (future + 1, future + 1))
    assert find_resume_checkpoint(folder).endswith("model_iteration6.torch")
    assert [n for _, _, n in list_checkpoints(folder)] == [
        "model_iteration2.torch",
        "model_phase0.torch",
        "model_iteration6.torch",
    ]


def test_at_equal_iteration_the_phase_end_checkpoint_is_newer(tmp_path):
    folder = str(tmp_path)
    save_checkpoint(folder, "model_phase0.torch", _progress(4, 0, True))
    save_checkpoint(folder, "model_iteration4.torch", _progress(4, 0, False))
    assert find_resume_checkpoint(folder).endswith("model_phase0.torch")


def test_unreadable_checkpoint_is_skipped_by_the_resume_choice(tmp_path):
    folder = str(tmp_path)
    save_checkpoint(folder, "model_iteration2.torch", _progress(2, 0, False))
    save_checkpoint(folder, "model_iteration4.torch", _progress(4, 0, False))
    data = (tmp_path / "model_iteration4.torch").read_bytes()
    (tmp_path / "model_iteration4.torch").write_bytes(data[: len(data) // 2])
    assert find_resume_checkpoint(folder).endswith("model_iteration2.torch")


def test_load_falls_back_when_the_chosen_checkpoint_fails_to_load(tmp_path, monkeypatch, caplog):
    """A checkpoint whose metadata reads but whose full load fails (e.g. a flipped byte in
    a tensor) gives way to the previous one, and the log names both."""
    import logging

    from vissl.trainer import checkpointing
    from vissl.utils.checkpoint import CheckpointLoadError, load_checkpoint

    folder = str(tmp_path)
    save_checkpoint(folder, "model_phase0.torch", _progress(4, 0))
    save_checkpoint(folder, "model_iteration6.torch", _progress(6, 1, False))

    def flaky_load(path, map_location="cpu"):
        if path.endswith("model_iteration6.torch"):
            raise CheckpointLoadError(f"checkpoint {path!r} is corrupt")
        return load_checkpoint(path, map_location)

    monkeypatch.setattr(checkpointing, "load_checkpoint", flaky_load)
    with caplog.at_level(logging.WARNING, logger="vissl"):
        logging.getLogger("vissl").propagate = True
        path, state = checkpointing.load_resume_checkpoint(
            os.path.join(folder, "model_iteration6.torch")
        )
    assert path.endswith("model_phase0.torch") and state["iteration"] == 4
    assert "model_iteration6.torch cannot be loaded" in caplog.text


def test_the_optimizer_implementation_is_not_taken_from_the_checkpoint(tmp_path):
    """sgd/adam/adamw are fused on CUDA: a checkpoint written there says fused=True, which
    must not carry over to a resume on the CPU (or the other way round)."""
    import torch

    from tests._tiny_run import tiny_config, train_in_process
    from vissl.hooks import default_hook_generator
    from vissl.utils.checkpoint import load_checkpoint, save_checkpoint

    cfg = tiny_config(tmp_path, "config.TEST_MODEL=False", "config.CHECKPOINT.AUTO_RESUME=True")
    train_in_process(cfg, default_hook_generator(cfg))
    path = tmp_path / "model_phase0.torch"
    state = load_checkpoint(str(path))
    for group in state["classy_state_dict"]["optimizer"]["param_groups"]:
        group["fused"] = True  # as written on a GPU
    state["classy_state_dict"]["phase_complete"] = True
    save_checkpoint(str(tmp_path / "gpu"), "model_phase0.torch", state)
    task = train_in_process(cfg, checkpoint_path=str(tmp_path / "gpu" / "model_phase0.torch"))
    assert task.iteration == 8
    assert all(not g.get("fused") for g in task.optimizer.param_groups)
    assert torch.isfinite(torch.tensor(task.phase_average_loss()))

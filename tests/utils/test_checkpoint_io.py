"""Checkpoint files: atomic writes, the pointer, weights_only loads, RNG state."""

from __future__ import annotations

import os
import pickle
import random

import numpy as np
import pytest
import torch

from vissl.utils.checkpoint import (
    CheckpointLoadError,
    get_rng_state,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
)


def test_save_moves_pointer_and_leaves_no_temp_files(tmp_path):
    save_checkpoint(str(tmp_path), "model_phase0.torch", {"w": torch.ones(2)})
    save_checkpoint(str(tmp_path), "model_phase1.torch", {"w": torch.zeros(2)})
    pointer = tmp_path / "checkpoint.torch"
    assert os.readlink(pointer) == "model_phase1.torch"
    assert torch.equal(load_checkpoint(str(pointer))["w"], torch.zeros(2))
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


def test_failed_write_keeps_previous_checkpoint(tmp_path):
    save_checkpoint(str(tmp_path), "model_phase0.torch", {"w": torch.ones(2)})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        save_checkpoint(str(tmp_path), "model_phase1.torch", {"w": Unpicklable()})
    assert not (tmp_path / "model_phase1.torch").exists()
    assert os.readlink(tmp_path / "checkpoint.torch") == "model_phase0.torch"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]


def test_load_refuses_pickled_code(tmp_path):
    path = tmp_path / "evil.torch"

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with open(path, "wb") as f:
        pickle.dump({"x": Evil()}, f)
    with pytest.raises(CheckpointLoadError, match="refuses"):
        load_checkpoint(str(path))


def test_truncated_file_is_a_clear_error(tmp_path):
    save_checkpoint(str(tmp_path), "model_phase0.torch", {"w": torch.ones(1000)})
    data = (tmp_path / "model_phase0.torch").read_bytes()
    (tmp_path / "model_phase0.torch").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointLoadError):
        load_checkpoint(str(tmp_path / "model_phase0.torch"))


def test_list_checkpoints_orders_by_recorded_progress(tmp_path):
    save_checkpoint(str(tmp_path), "model_iteration9.torch", {"iteration": 9, "phase_idx": 2})
    save_checkpoint(str(tmp_path), "model_phase0.torch", {"iteration": 3, "phase_idx": 0})
    (tmp_path / "model_phase1.torch").write_bytes(b"not a checkpoint")
    unreadable: list[str] = []
    names = [n for _, _, n in list_checkpoints(str(tmp_path), unreadable)]
    assert names == ["model_phase0.torch", "model_iteration9.torch"]
    assert unreadable == ["model_phase1.torch"]


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = get_rng_state()
    save_checkpoint(str(tmp_path), "model_phase0.torch", {"rng": state})
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(load_checkpoint(str(tmp_path / "checkpoint.torch"))["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


class _FakeCuda:
    """torch.cuda as two visible GPUs, this process on device 1; records RNG calls."""

    def __init__(self, visible: int = 2, current: int = 1) -> None:
        self.visible, self.current = visible, current
        self.set_calls: list[torch.Tensor] = []

    def install(self, monkeypatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "device_count", lambda: self.visible)
        monkeypatch.setattr(
            cuda, "get_rng_state", lambda device="cuda": torch.tensor([10 + self.current])
        )
        monkeypatch.setattr(
            cuda, "set_rng_state", lambda state, device="cuda": self.set_calls.append(state)
        )

        def every_device(*args, **kwargs):
            raise AssertionError("the RNG states of every visible device are not used")

        monkeypatch.setattr(cuda, "get_rng_state_all", every_device)
        monkeypatch.setattr(cuda, "set_rng_state_all", every_device)


def test_cuda_rng_saves_and_restores_the_current_device_only(monkeypatch) -> None:
    """#22 item 3: resuming on fewer visible GPUs raised IndexError (set_rng_state_all)."""
    fake = _FakeCuda(visible=2, current=1)
    fake.install(monkeypatch)
    state = get_rng_state()
    assert torch.equal(state["cuda"], torch.tensor([11]))  # device 1's only
    fake.visible, fake.current = 1, 0  # resumed where one GPU is visible
    set_rng_state(state)
    assert [t.tolist() for t in fake.set_calls] == [[11]]


def test_cuda_rng_of_an_older_checkpoint_with_every_device(monkeypatch) -> None:
    fake = _FakeCuda(visible=1, current=0)
    fake.install(monkeypatch)
    state = get_rng_state()
    state["cuda"] = [torch.tensor([20]), torch.tensor([21]), torch.tensor([22])]
    set_rng_state(state)  # three saved, one visible: this device's entry
    fake.current = 2
    set_rng_state(state)
    fake.current = 5  # fewer saved than this index: the first
    set_rng_state(state)
    assert [t.tolist() for t in fake.set_calls] == [[20], [22], [20]]


def test_local_checkpoints_are_memory_mapped_and_legacy_files_still_load(tmp_path, monkeypatch):
    """#22 item 12: resume files are loaded with mmap (tensors read when used)."""
    seen: list[dict] = []
    real_load = torch.load

    def spy(f, *args, **kwargs):
        seen.append(kwargs)
        return real_load(f, *args, **kwargs)

    save_checkpoint(str(tmp_path), "model_phase0.torch", {"w": torch.arange(4.0)})
    legacy = tmp_path / "legacy.torch"
    torch.save({"w": torch.arange(3.0)}, legacy, _use_new_zipfile_serialization=False)
    monkeypatch.setattr(torch, "load", spy)
    assert torch.equal(
        load_checkpoint(str(tmp_path / "model_phase0.torch"))["w"], torch.arange(4.0)
    )
    assert seen[-1].get("mmap") is True and seen[-1]["weights_only"] is True
    assert torch.equal(load_checkpoint(str(legacy))["w"], torch.arange(3.0))
    assert not seen[-1].get("mmap")

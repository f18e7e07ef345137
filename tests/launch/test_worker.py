"""One worker's set-up: thread counts, error classification."""

from __future__ import annotations

import os

import pytest

from vissl.launch import worker
from vissl.launch.worker import is_communication_error, worker_threads


@pytest.fixture
def sixteen_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)


def test_workers_share_the_cores_on_gpu_as_on_cpu(sixteen_cores):
    # 8 GPU workers must not each use all 16 cores (the data loaders need them too).
    assert worker_threads("spawn", 8) == 2
    assert worker_threads("forkserver", 2) == 8
    assert worker_threads("spawn", 32) == 1


def test_fork_workers_get_one_thread(sixteen_cores):
    assert worker_threads("fork", 2) == 1


def test_omp_num_threads_set_by_the_user_wins(sixteen_cores, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert worker_threads("spawn", 8) == 3
    assert worker_threads("fork", 8) == 3


def test_communication_errors_are_told_from_a_ranks_own_error():
    assert is_communication_error("DistBackendError: NCCL communicator was aborted")
    assert is_communication_error("RuntimeError: [gloo] Read error: Connection reset by peer")
    assert not is_communication_error("RuntimeError: deliberate failure on rank 1")
    assert worker.ERROR_FILE_ENV == "TORCHELASTIC_ERROR_FILE"

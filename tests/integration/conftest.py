"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread for the test (the quick configs' models run fastest on one, and
    the test machine is shared); the count is restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

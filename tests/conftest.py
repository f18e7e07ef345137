"""Shared test set-up: small thread counts, quiet progress bars."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TQDM_DISABLE", "1")
torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _restore_cwd():
    cwd = os.getcwd()
    yield
    os.chdir(cwd)

"""Shared test set-up: small thread counts, quiet progress bars."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from tests import _yaml_cache

os.environ.setdefault("TQDM_DISABLE", "1")
# each YAML text parsed once per test process (see tests/_yaml_cache.py)
_yaml_cache.install()
# Under pytest-xdist (``-n 2``, the README's command) each worker is one of the machine's
# cores: one thread each, and the processes a test starts inherit OMP_NUM_THREADS=1.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    # xdist's workers ignore SIGINT, and an ignored signal stays ignored in the processes
    # they start: the Ctrl-C tests need Python's default (KeyboardInterrupt) back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
else:
    torch.set_num_threads(2)


@pytest.fixture(autouse=True)
def _restore_cwd():
    cwd = os.getcwd()
    yield
    os.chdir(cwd)

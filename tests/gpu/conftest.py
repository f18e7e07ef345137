"""The CUDA suite (``pytest -m gpu``): every test here needs a CUDA device and skips
without one; the CPU parts of the same features are tested beside their modules."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device")
    multi = pytest.mark.skip(reason="needs 2 or more CUDA devices")
    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    for item in items:
        if "tests/gpu/" not in str(item.fspath).replace("\\", "/"):
            continue
        item.add_marker(pytest.mark.gpu)
        if not available:
            item.add_marker(skip)
        elif "multi_gpu" in item.keywords and count < 2:
            item.add_marker(multi)

"""Fixtures for the data tests: a full default config and tiny image folders."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import vissl
from vissl.config.attr_dict import AttrDict

DEFAULTS = Path(vissl.__file__).parent / "config" / "defaults.yaml"


@functools.lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    with open(DEFAULTS) as f:
        return yaml.safe_load(f)["config"]


def make_cfg(
    train: dict[str, Any] | None = None, test: dict[str, Any] | None = None, **top: Any
) -> AttrDict:
    """The default config with DATA.TRAIN / DATA.TEST / top-level overrides."""
    raw = copy.deepcopy(_defaults())
    raw["DATA"]["NUM_DATALOADER_WORKERS"] = 0
    for split, overrides in (("TRAIN", train), ("TEST", test)):
        raw["DATA"][split].update(overrides or {})
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key].update(value)
        else:
            raw[key] = value
    return AttrDict(raw)


@pytest.fixture
def cfg_factory() -> Callable[..., AttrDict]:
    return make_cfg


def write_png(path: Path, color: tuple[int, int, int], size: int = 6) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size, 3), color, dtype=np.uint8)).save(path)
    return path


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """``root/{cat,dog}/{0,1}.png``: 4 tiny images, class 0 = cat, 1 = dog."""
    root = tmp_path / "images"
    for cls, color in (("cat", (200, 10, 10)), ("dog", (10, 10, 200))):
        for i in range(2):
            write_png(root / cls / f"{i}.png", (color[0], color[1] + 40 * i, color[2]))
    return root


@pytest.fixture
def png_writer() -> Callable[..., Path]:
    return write_png


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """One torch thread, as in a data loader worker (the tensor path's setting; several
    threads on small images only add synchronisation, badly so on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

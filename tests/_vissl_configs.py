"""VISSL's own config files in tests, behind ``VISSL_CONFIGS_DIR``.

VISSL's files are not shipped: a test that runs one needs ``VISSL_CONFIGS_DIR`` set to the
``configs/config`` folder of a VISSL checkout, and skips without it.
:func:`copy_vissl_config` puts one file where Hydra finds it (``./configs/config`` of the
current folder, which Hydra searches beside vissl's own configs) and returns its name for
``config=``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

needs_vissl_configs = pytest.mark.skipif(
    not os.environ.get("VISSL_CONFIGS_DIR"),
    reason="VISSL_CONFIGS_DIR (VISSL's configs/config folder) is not set",
)


def vissl_config_path(relative: str) -> Path:
    """The path of VISSL's ``relative`` (under its configs/config); it must exist."""
    src = Path(os.environ["VISSL_CONFIGS_DIR"]) / relative
    assert src.is_file(), f"{src} not found: VISSL_CONFIGS_DIR must be VISSL's configs/config"
    return src


def copy_vissl_config(folder: Path, relative: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Copy VISSL's ``relative`` (e.g. ``test/integration_test/quick_msn.yaml``) to
    ``folder/configs/config/vissl_original/`` unchanged, make ``folder`` the current folder
    (VISSL's configs also write to ``CHECKPOINT.DIR: "."``) and return the config name
    (``vissl_original/quick_msn``)."""
    src = vissl_config_path(relative)
    dst = folder / "configs" / "config" / "vissl_original"
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst / src.name)
    monkeypatch.chdir(folder)
    return f"vissl_original/{src.stem}"

"""``hydra_compose_and_validate`` from a project with its own ``configs/`` folder (#41
item 7): the shipped configs are still found, and a missing config is the "not found"
error the docs promise (it was ``TypeError: expected str ... not NoneType``)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

from vissl.errors import ConfigError
from vissl.utils.hydra_config import hydra_compose_and_validate

MINE = "# @package _global_\nconfig:\n  LOG_FREQUENCY: 3\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The current folder is a project with configs/config/my_exp/mine.yaml, and
    ``configs`` imports as that folder (a namespace package), as it does when Python runs
    from there with vissl installed."""
    (tmp_path / "configs" / "config" / "my_exp").mkdir(parents=True)
    (tmp_path / "configs" / "config" / "my_exp" / "mine.yaml").write_text(MINE)
    monkeypatch.chdir(tmp_path)
    spec = importlib.machinery.ModuleSpec("configs", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path / "configs")]
    shadow = importlib.util.module_from_spec(spec)
    assert getattr(shadow, "__file__", None) is None
    monkeypatch.setitem(sys.modules, "configs", shadow)
    return tmp_path


def test_the_shipped_configs_are_found_beside_the_vissl_package():
    from vissl.utils.hydra_config import shipped_configs_dir

    folder = shipped_configs_dir()
    assert folder is not None and (folder / "config" / "quick_start.yaml").is_file()


def test_shipped_and_own_configs_compose_from_a_project_with_configs(project):
    _, cfg = hydra_compose_and_validate(["config=quick_start"])
    assert cfg.LOSS.name == "simclr_info_nce_loss"
    _, cfg = hydra_compose_and_validate(["config=my_exp/mine"])
    assert cfg.LOG_FREQUENCY == 3


def test_a_missing_config_is_the_not_found_error_from_a_project_with_configs(project):
    with pytest.raises(ConfigError) as info:
        hydra_compose_and_validate(["config=my_exp/mien"])
    message = str(info.value)
    assert "config=my_exp/mien: no such config" in message
    assert str(Path(project) / "configs" / "config") in message
    assert "Closest: my_exp/mine" in message

"""config.IMPORTS and `vissl.plugins` entry points."""

from __future__ import annotations

import sys
import types

import pytest

from vissl.errors import ConfigError
from vissl.trainer.train_steps import TRAIN_STEP_REGISTRY
from vissl.utils import imports


def test_entry_point_plugins_are_loaded(monkeypatch):
    module = types.ModuleType("fake_vissl_plugin_pkg")

    def load():
        @TRAIN_STEP_REGISTRY.register("from_entry_point")
        def step(task):
            return task

        return module

    class FakeEntryPoint:
        name, value = "fake", "fake_vissl_plugin_pkg"

        def load(self):
            return load()

    monkeypatch.setattr(
        imports,
        "entry_points",
        lambda group: [FakeEntryPoint()] if group == "vissl.plugins" else [],
    )
    try:
        imports.import_plugins([])
        assert "from_entry_point" in TRAIN_STEP_REGISTRY
    finally:
        TRAIN_STEP_REGISTRY.unregister("from_entry_point")


def test_import_by_path_is_idempotent(tmp_path):
    plugin = tmp_path / "plug.py"
    plugin.write_text(
        "from vissl.trainer.train_steps import register_train_step\n"
        "@register_train_step('from_file_step')\n"
        "def s(task):\n    return task\n"
    )
    try:
        imports.import_plugins([str(plugin)])
        imports.import_plugins([str(plugin)])  # a second import does not re-register
        assert "from_file_step" in TRAIN_STEP_REGISTRY
    finally:
        TRAIN_STEP_REGISTRY.unregister("from_file_step")


def test_import_by_module_name(tmp_path, monkeypatch):
    (tmp_path / "my_mod_plugin.py").write_text("VALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    imports.import_plugins(["my_mod_plugin"])
    assert sys.modules["my_mod_plugin"].VALUE == 3


def test_missing_plugin_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"config.IMPORTS: file .* does not exist"):
        imports.import_plugins([str(tmp_path / "nope.py")])
    with pytest.raises(ConfigError, match="cannot be found"):
        imports.import_plugins(["no_such_module_anywhere"])

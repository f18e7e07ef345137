"""Keys accepted but not implemented warn by name; implemented ones do not; nulls VISSL uses."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

import vissl
from vissl.config import validation
from vissl.config.validation import NOT_IMPLEMENTED, UnsupportedConfigWarning
from vissl.utils.hydra_config import hydra_compose_and_validate

ROOT = Path(vissl.__file__).parent
REPO = ROOT.parent


def compose(*overrides: str) -> Any:
    return hydra_compose_and_validate(["config=quick_start", *overrides])


def _unsupported_warnings(*overrides: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compose(*overrides)
    return [str(w.message) for w in caught if issubclass(w.category, UnsupportedConfigWarning)]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("config.DATA.TRAIN.COPY_DESTINATION_DIR=/tmp/x", "config.DATA.TRAIN.COPY_DESTINATION_DIR"),
        ("config.CHECKPOINT.BACKEND=manifold", "config.CHECKPOINT.BACKEND"),
    ],
)
def test_unimplemented_key_warns_naming_it(override: str, key: str) -> None:
    messages = _unsupported_warnings(override)
    assert any(key in m for m in messages), messages


@pytest.mark.parametrize(
    "override",
    [
        "config.HOOKS.MODEL_COMPLEXITY.COMPUTE_COMPLEXITY=true",
        "config.HOOKS.MEMORY_SUMMARY.DUMP_MEMORY_ON_EXCEPTION=true",
        "config.HOOKS.MEMORY_SUMMARY.LOG_ITERATION_NUM=3",
        "config.HOOKS.LOG_GPU_STATS=false",
    ],
)
def test_implemented_hook_keys_do_not_warn(override: str) -> None:
    assert _unsupported_warnings(override) == []


def test_the_table_drives_the_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    override = "config.DATA.TRAIN.COPY_DESTINATION_DIR=/tmp/x"
    assert _unsupported_warnings(override)
    table = {k: v for k, v in NOT_IMPLEMENTED.items() if k != "DATA.TRAIN.COPY_DESTINATION_DIR"}
    monkeypatch.setattr(validation, "NOT_IMPLEMENTED", table)
    assert _unsupported_warnings(override) == []


def _leaf_paths(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and path not in validation.OPEN_SUBTREES:
            out += _leaf_paths(value, path + ".")
        else:
            out.append(path)
    return out


def test_every_default_key_is_read_or_listed_as_not_implemented() -> None:
    """A key in defaults.yaml that no module reads must be in the NOT_IMPLEMENTED table."""
    with open(ROOT / "config" / "defaults.yaml", encoding="utf-8") as f:
        defaults = yaml.safe_load(f)["config"]
    sources = [
        p.read_text(encoding="utf-8")
        for folder in (ROOT, REPO / "tools")
        for p in folder.rglob("*.py")
        if p.name != "validation.py"
    ]
    text = "\n".join(sources)
    checked_by_validation = {
        "TRAINER.TASK_NAME",  # only one value is valid
        # batches are always copied with non_blocking=True (vissl/data/batch.py);
        # validation warns when PIN_MEMORY is off, which makes that copy blocking
        "DATA.ENABLE_ASYNC_GPU_COPY",
        # VISSL main's key, moved to SVM.FEATURES.PATH by validation
        "SVM_FEATURES_PATH",
    }
    unread = [
        path
        for path in _leaf_paths(defaults)
        if path not in NOT_IMPLEMENTED
        and path not in checked_by_validation
        and not any(path == p or path.startswith(p + ".") for p in NOT_IMPLEMENTED)
        and not re.search(rf"\b{re.escape(path.rpartition('.')[2])}\b", text)
    ]
    assert unread == [], (
        f"keys nothing reads; implement them or add them to NOT_IMPLEMENTED: {unread}"
    )


def test_table_entries_are_valid_keys() -> None:
    with open(ROOT / "config" / "defaults.yaml", encoding="utf-8") as f:
        defaults = yaml.safe_load(f)["config"]
    for path in NOT_IMPLEMENTED:
        node: Any = defaults
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, path
            node = node[part]
        assert node == NOT_IMPLEMENTED[path], path


@pytest.mark.parametrize("key", ["EXPERIMENT_LOG_DIR", "LOG_DIR"])
def test_tensorboard_dirs_accept_null(key: str) -> None:
    _, cfg = compose(f"config.HOOKS.TENSORBOARD_SETUP.{key}=null")
    assert cfg.HOOKS.TENSORBOARD_SETUP[key] is None


def test_async_gpu_copy_without_pinned_memory_warns() -> None:
    gpu = ["config.MACHINE.DEVICE=gpu", "config.DATA.PIN_MEMORY=false"]
    assert any("ENABLE_ASYNC_GPU_COPY" in m for m in _unsupported_warnings(*gpu))
    assert not any(
        "ENABLE_ASYNC_GPU_COPY" in m for m in _unsupported_warnings("config.DATA.PIN_MEMORY=false")
    )


def test_apex_opt_level_warns_only_when_amp_is_on() -> None:
    """#41 item 10: VISSL's configs set AMP_ARGS.opt_level with USE_AMP off; the key is
    then not used at all, so it does not warn."""
    key = "config.MODEL.AMP_PARAMS.AMP_ARGS.opt_level"
    on = _unsupported_warnings(f"{key}=O2", "config.MODEL.AMP_PARAMS.USE_AMP=true")
    assert any(key in m for m in on), on
    assert _unsupported_warnings(f"{key}=O2", "config.MODEL.AMP_PARAMS.USE_AMP=false") == []


def test_config_warnings_print_one_line_without_python_source() -> None:
    """#41 item 10: vissl's warnings print as ``Category: message``; Python's format
    added vissl's file, line and a source line (``  upgrade_legacy_keys(cfg)``)."""
    text = warnings.formatwarning(
        "config.X is ignored", UnsupportedConfigWarning, str(ROOT / "config/validation.py"), 9
    )
    assert text == "UnsupportedConfigWarning: config.X is ignored\n"
    other = warnings.formatwarning("other", UserWarning, __file__, 1)
    assert other.startswith(f"{__file__}:1: UserWarning: other")  # others: Python's format


def test_the_command_line_prints_config_warnings_as_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vissl.launch import cli as tool

    monkeypatch.setattr(
        "sys.argv",
        [
            "tools/run_distributed_engines.py",
            "config=quick_start",
            "+config.DATA.TRANSFORMS=[]",  # VISSL ignores it: a warning
            "config.OPTIMIZER.num_epochs=0",  # then an error: nothing trains
            f"config.CHECKPOINT.DIR={tmp_path}",
        ],
    )

    def show(message: Any, category: Any, filename: str, lineno: int, *args: Any) -> None:
        # what Python's own showwarning writes (pytest records warnings instead)
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, None))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        assert tool.main() == 2
    stderr = capsys.readouterr().err
    lines = [ln for ln in stderr.splitlines() if "config.DATA.TRANSFORMS" in ln]
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith("UnsupportedConfigWarning: config.DATA.TRANSFORMS is ignored")
    assert "validation.py" not in stderr and "upgrade_legacy_keys" not in stderr

"""docs/config_reference.md is generated from vissl/config/defaults.yaml and up to date.

Regenerate it with ``python extra_scripts/generate_config_reference.py`` after changing
``defaults.yaml``; every key needs a comment there (its meaning on the page).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from vissl.config.validation import _load_defaults_file

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "extra_scripts" / "generate_config_reference.py"
PAGE = REPO / "docs" / "config_reference.md"
REGENERATE = f"python {SCRIPT.relative_to(REPO)}"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_config_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gen = _generator()


def _leaf_paths(tree: dict, prefix: str) -> list[str]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out += _leaf_paths(value, f"{prefix}{key}.")
        else:
            out.append(prefix + key)
    return out


def test_page_is_up_to_date() -> None:
    expected = gen.render(gen.load_keys())
    current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    assert current == expected, (
        f"{PAGE.relative_to(REPO)} is out of date with vissl/config/defaults.yaml: "
        f"run `{REGENERATE}` and commit the result"
    )


def test_every_key_has_a_meaning() -> None:
    missing = gen.undocumented(gen.load_keys())
    assert not missing, (
        f"keys of vissl/config/defaults.yaml without a comment: {missing}; write one above "
        f"each key, then run `{REGENERATE}`"
    )


def test_every_default_key_is_on_the_page() -> None:
    """Independently of the generator's parser: the keys validation knows are listed."""
    page = PAGE.read_text(encoding="utf-8")
    listed = set(re.findall(r"^- `([^`]+)`", page, flags=re.MULTILINE))
    config = _load_defaults_file()["config"]
    leaves = _leaf_paths(config, "config.")
    # an inline {a: b} default is listed as one key
    absent = [
        p for p in leaves if p not in listed and not any(p.startswith(f + ".") for f in listed)
    ]
    assert not absent, f"keys missing from the page: {absent}; run `{REGENERATE}`"
    assert len(leaves) > 300


def test_check_flags_a_stale_page_and_an_undocumented_key(tmp_path: Path) -> None:
    defaults = (REPO / "vissl" / "config" / "defaults.yaml").read_text(encoding="utf-8")
    page = tmp_path / "config_reference.md"
    copy = tmp_path / "defaults.yaml"
    copy.write_text(defaults, encoding="utf-8")
    assert gen.main(["--defaults", str(copy), "--output", str(page)]) == 0
    assert gen.main(["--defaults", str(copy), "--output", str(page), "--check"]) == 0
    # a new key with a comment: the page is stale until regenerated
    copy.write_text(
        defaults.replace("  VERBOSE: False\n", "  VERBOSE: False\n  # a new key\n  NEW_KEY: 1\n"),
        encoding="utf-8",
    )
    assert gen.main(["--defaults", str(copy), "--output", str(page), "--check"]) == 1
    assert gen.main(["--defaults", str(copy), "--output", str(page)]) == 0
    assert "- `config.NEW_KEY` = `1`: a new key" in page.read_text(encoding="utf-8")
    # a new key without a comment: refused
    copy.write_text(defaults.replace("  VERBOSE: False\n", "  VERBOSE: False\n  BARE: 1\n"))
    assert gen.main(["--defaults", str(copy), "--output", str(page)]) == 1


def test_help() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--check" in out and "defaults.yaml" in out


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('    KEY: "a # b"  # the meaning', ('"a # b"', "the meaning")),
        ("    KEY: [1, 2]", ("[1, 2]", "")),
    ],
)
def test_inline_comments(line: str, expected: tuple[str, str]) -> None:
    assert gen._split_value(line.split(": ", 1)[1]) == expected

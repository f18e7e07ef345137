"""The docs build with MkDocs in strict mode: a warning (a broken link or anchor, a page
missing from the nav, a nav entry without a page) fails the build, and so this test.

    mkdocs build --strict      # what this test runs, into a temporary folder
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason='mkdocs is not installed: pip install -e ".[docs]" (the dev extra has it too)',
)


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _warnings(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stdout + proc.stderr).splitlines()
    return "\n".join(line for line in lines if not line.startswith("INFO"))


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in _nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in _nav_pages(value)]
    return []


def test_docs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = _build(REPO / "mkdocs.yml", site)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{_warnings(proc)}"
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["strict"] is True
    for page in _nav_pages(config["nav"]):
        built = site / (page[: -len("index.md")] if page.endswith("index.md") else page[:-3])
        assert (built / "index.html").exists() or (site / "index.html").exists(), page


def _docs_copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copytree(REPO / "docs", root / "docs")
    return root


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("[a page that does not exist](no_such_page.md)", r"no_such_page\.md"),
        ("[an anchor that does not exist](config.md#no-such-section)", r"no-such-section"),
        ("[a file outside docs/](../tools/run_distributed_engines.py)", r"run_distributed_engines"),
    ],
)
def test_a_broken_link_fails_the_build(tmp_path: Path, broken: str, message: str) -> None:
    root = _docs_copy(tmp_path)
    index = root / "docs" / "index.md"
    index.write_text(index.read_text(encoding="utf-8") + f"\n{broken}\n", encoding="utf-8")
    proc = _build(root / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0, f"the strict build accepted {broken!r}"
    assert re.search(message, _warnings(proc)), _warnings(proc)


def test_a_page_missing_from_the_nav_fails_the_build(tmp_path: Path) -> None:
    root = _docs_copy(tmp_path)
    (root / "docs" / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
    proc = _build(root / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0 and "orphan.md" in _warnings(proc), _warnings(proc)

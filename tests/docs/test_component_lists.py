"""The component lists of docs/components.md and docs/migrating_from_vissl.md are generated
from the registries and up to date (#41 item 6: the pages listed 11 losses, 7 heads and 7
collators when the registries held 22, 17 and 13).

Regenerate them with ``python extra_scripts/generate_component_lists.py`` after
registering a component.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "extra_scripts" / "generate_component_lists.py"


def _generator():
    spec = importlib.util.spec_from_file_location("generate_component_lists", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_the_generated_blocks_are_up_to_date() -> None:
    stale = [
        str(page.relative_to(REPO))
        for page, (current, text) in gen.updated_pages().items()
        if current != text
    ]
    assert not stale, (
        f"{stale} list other components than the registries: run python {SCRIPT.relative_to(REPO)}"
    )


def test_every_registered_name_is_on_the_components_page() -> None:
    from vissl.utils.imports import import_vissl_plugins
    from vissl.utils.registry import get_registry

    import_vissl_plugins()
    page = (REPO / "docs" / "components.md").read_text(encoding="utf-8")
    table = re.search(r"<!-- generated: components -->(.*?)<!-- /generated", page, re.S)
    assert table is not None
    for kind in gen.KINDS:
        registry = get_registry(kind.registry)
        assert registry is not None, kind.registry
        names = gen._names(registry)  # built in (tests register plugins of their own)
        row = next(
            line for line in table.group(1).splitlines() if line.startswith(f"| {kind.label} ")
        )
        assert (f"{len(names)}: " in row) if names else ("none" in row), row
        for name in names:
            assert f"`{name}`" in row, (kind.registry, name)


def test_the_vissl_comparison_names_only_what_vissl_lacks() -> None:
    from vissl.utils.registry import get_registry

    text = (REPO / "docs" / "migrating_from_vissl.md").read_text(encoding="utf-8")
    item = re.search(r"<!-- generated: vissl-components -->(.*?)<!-- /generated", text, re.S)
    assert item is not None and "vissl lacks:" in item.group(1)
    lacks = item.group(1).split("vissl lacks:")[1]
    for registry_name, vissl_names in gen.VISSL_NAMES.items():
        registry = get_registry(registry_name)
        assert registry is not None
        for name in vissl_names:
            assert (f"`{name}`" in lacks) != gen._accepts(registry, name), name

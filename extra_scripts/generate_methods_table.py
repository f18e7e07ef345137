#!/usr/bin/env python3
"""Write the methods table of ``docs/methods/index.md`` from :mod:`vissl.methods`.

    python extra_scripts/generate_methods_table.py            # rewrite the table
    python extra_scripts/generate_methods_table.py --check    # exit 1 if it is stale

The script owns what is between ``<!-- generated: methods -->`` and
``<!-- /generated: methods -->``; ``tests/test_methods.py`` fails when the committed table
differs from its output: add or change a method in ``vissl/methods.py``, then run this.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PAGE = ROOT / "docs" / "methods" / "index.md"
BEGIN, END = "<!-- generated: methods -->", "<!-- /generated: methods -->"


def _code(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names) or "-"


def _configs(names: tuple[str, ...]) -> str:
    return "<br>".join(f"`{n}`" for n in names) or "-"


def table() -> str:
    from vissl.methods import METHODS, loss_source

    rows = [
        "| Method | Loss (file) | Heads | Collator | Hooks | Frozen copy | Quick | Digits |"
        " ImageNet |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in METHODS:
        page = Path(m.docs).relative_to("methods") if m.docs.startswith("methods/") else None
        link = f"[{m.title}]({page})" if page else f"[{m.title}](../{m.docs})"
        losses = "<br>".join(f"`{n}` ({loss_source(n)})" for n in m.loss)
        rows.append(
            f"| {link} | {losses} | {_code(m.heads)} | {_code([m.collator] if m.collator else [])}"
            f" | {_code(m.hooks)} | {f'`{m.teacher}`' if m.teacher else '-'}"
            f" | {_configs(m.configs.quick)} | {_configs(m.configs.digits)}"
            f" | {_configs(m.configs.pretrain)} |"
        )
    return "\n".join(rows)


def updated() -> tuple[str, str]:
    """(the page as committed, the page with a fresh table)."""
    current = PAGE.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(current):
        raise SystemExit(f"{PAGE} has no {BEGIN} ... {END} block")
    fresh = pattern.sub(lambda _: f"{BEGIN}\n{table()}\n{END}", current)
    return current, fresh


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    args = parser.parse_args(argv)
    current, fresh = updated()
    if args.check:
        if current != fresh:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python {Path(__file__).name}")
            return 1
        print("methods table up to date")
        return 0
    PAGE.write_text(fresh, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

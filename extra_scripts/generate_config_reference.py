#!/usr/bin/env python3
"""Write docs/config_reference.md from vissl/config/defaults.yaml.

    python extra_scripts/generate_config_reference.py            # rewrite the page
    python extra_scripts/generate_config_reference.py --check    # exit 1 if it is stale

Every key of ``defaults.yaml`` is listed with its full path, its default (as written in
the file) and its meaning, grouped by the top-level section of ``config``. The meaning is
the comment written directly above the key (or after it on the same line). A section whose
comment contains ``(keys as in PATH)`` lends the meaning of ``PATH.<key>`` to its keys that
have no comment of their own (``DATA.TEST`` has the keys of ``DATA.TRAIN``). Section
banners (``# ---- #`` lines) give each section its introduction.

``tests/docs/test_config_reference.py`` fails when the committed page differs from this
script's output, or when a key has no meaning: document a new key with a comment in
``defaults.yaml``, then run this script.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = ROOT / "vissl" / "config" / "defaults.yaml"
OUTPUT = ROOT / "docs" / "config_reference.md"

#: Root keys that are Hydra's machinery, not settings of a run.
HYDRA_KEYS = {"defaults", "hydra"}

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w\-+]*):(?: (?P<value>.*))?$")
_BANNER = re.compile(r"^#\s*-{10,}\s*#?$")
_INHERIT = re.compile(r"\(keys as in ([\w.]+)\)")
GENERATOR = "extra_scripts/generate_config_reference.py"


@dataclass
class Key:
    """One key of defaults.yaml."""

    path: str  # "config.DATA.TRAIN.DATA_SOURCES", or a root key ("node_id")
    raw: str  # the default as written; "" for a section
    comment: list[str] = field(default_factory=list)
    banner: list[str] = field(default_factory=list)  # a section banner's text
    is_section: bool = False

    @property
    def meaning(self) -> str:
        return " ".join(self.comment)


def _split_value(text: str) -> tuple[str, str]:
    """``value  # comment`` -> (value, comment), leaving ``#`` inside quotes alone."""
    quote = ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] == " "):
            return text[:i].rstrip(), text[i + 1 :].strip()
    return text.rstrip(), ""


def parse_defaults(text: str) -> list[Key]:
    """The keys of ``defaults.yaml`` in file order, with their comments.

    Raises:
        ValueError: a line this simple parser does not understand (a value spread over
            several lines), or a key whose default does not load as YAML.
    """
    keys: list[Key] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing sections
    comment: list[str] = []
    banner: list[str] = []
    in_banner = False
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            comment = []  # a comment is the key's only when directly above it
            continue
        if stripped.startswith("#"):
            if _BANNER.match(stripped):
                in_banner = not in_banner
                if in_banner:
                    banner = []
                comment = []
                continue
            body = stripped[1:].strip()
            (banner if in_banner else comment).append(body)
            continue
        if stripped.startswith("- "):
            if stack and stack[0][1] in HYDRA_KEYS:
                continue
            raise ValueError(f"defaults.yaml:{n}: block lists are not supported: {line!r}")
        m = _KEY.match(line)
        if not m:
            raise ValueError(f"defaults.yaml:{n}: cannot parse {line!r}")
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        value, inline = _split_value(m["value"] or "")
        parents = [k for _, k in stack]
        if (parents[0] if parents else m["key"]) in HYDRA_KEYS:
            if not value:
                stack.append((indent, m["key"]))
            comment = []
            continue
        path = ".".join([*parents, m["key"]])
        notes = [*comment, inline] if inline else list(comment)
        key = Key(path, value, notes, banner, is_section=not value)
        if value:
            yaml.safe_load(value)  # raises on a value this parser cut wrongly
        keys.append(key)
        if not value:
            stack.append((indent, m["key"]))
        comment, banner = [], []
    return keys


def inherit_meanings(keys: list[Key]) -> None:
    """Fill the meaning of uncommented keys of ``(keys as in PATH)`` sections."""
    by_path = {k.path: k for k in keys}
    for section in [k for k in keys if k.is_section]:
        m = _INHERIT.search(section.meaning)
        if not m:
            continue
        source = m[1] if m[1].startswith("config.") else f"config.{m[1]}"
        prefix = section.path + "."
        for key in keys:
            if key.path.startswith(prefix) and not key.comment:
                twin = by_path.get(source + key.path[len(section.path) :])
                if twin is not None and twin.comment:
                    key.comment = list(twin.comment)


def load_keys(defaults: Path = DEFAULTS) -> list[Key]:
    """The documented keys, checked against what ``yaml.safe_load`` reads from the file."""
    text = defaults.read_text(encoding="utf-8")
    keys = parse_defaults(text)
    inherit_meanings(keys)
    loaded = yaml.safe_load(text)
    for key in keys:
        node: Any = loaded
        for part in key.path.split("."):
            node = node[part]
        if not key.is_section and node != yaml.safe_load(key.raw):
            raise ValueError(f"{key.path}: parsed {key.raw!r}, yaml reads {node!r}")
    paths = {k.path for k in keys}
    leaves = {k.path for k in keys if not k.is_section}  # an inline {a: b} is one value
    missing = [
        p
        for p in _all_paths(loaded)
        if p not in paths and not any(p.startswith(leaf + ".") for leaf in leaves)
    ]
    if missing:
        raise ValueError(f"keys the parser missed: {missing}")
    return keys


def _all_paths(tree: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        if not prefix and key in HYDRA_KEYS:
            continue
        yield prefix + key
        if isinstance(value, dict) and value:
            yield from _all_paths(value, f"{prefix}{key}.")


def undocumented(keys: list[Key]) -> list[str]:
    """Paths of the keys without a meaning."""
    return [k.path for k in keys if not k.meaning.strip()]


def _md(text: str) -> str:
    """Comment text as Markdown text: ``<PATH>`` is not HTML, ``*`` not emphasis."""
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")


def _intro(name: str, banner: list[str]) -> str:
    """A banner's text without the section name it starts with."""
    text = " ".join(banner).strip()
    if text.startswith(name):
        text = text[len(name) :].lstrip(" :")
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return text[:1].upper() + text[1:] if text else ""


def render(keys: list[Key]) -> str:
    """The Markdown page."""
    out = [
        "# Config reference",
        "",
        f"<!-- Generated by {GENERATOR} from vissl/config/defaults.yaml; do not edit. -->",
        "",
        "Every key of `vissl/config/defaults.yaml`, with its full path, its default and its",
        "meaning, in the order of the file. Set a key in a config file under `config:` or on",
        "the command line (`config.OPTIMIZER.num_epochs=2`); see [Configuration](config.md)",
        "for composition and validation, and [Built-in components](components.md) for the",
        "names the keys select. This page is generated from the comments of `defaults.yaml`",
        f"by `python {GENERATOR}`; a test fails when it is out of date.",
        "",
    ]
    root = [k for k in keys if not k.path.startswith("config.") and k.path != "config"]
    sections: dict[str, list[Key]] = {}
    for key in keys:
        parts = key.path.split(".")
        if parts[0] != "config" or len(parts) < 2:
            continue
        name = parts[1] if len(parts) > 2 or key.is_section else "GLOBALS"
        sections.setdefault(name, []).append(key)
    out += [
        "## Root keys",
        "",
        "Keys beside `config:`, set on the command line without the",
        "`config.` prefix (`engine_name=extract_features`, `node_id=1`).",
        "",
    ]
    out += [_item(k) for k in root] + [""]
    for name, members in sections.items():
        out += [f"## {name}", ""]
        if name == "GLOBALS":
            out += ["Keys directly under `config:`.", ""]
        intro = _intro(name, members[0].banner)
        if intro:
            out += [_md(intro), ""]
        out += [_item(k) for k in members] + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def _item(key: Key) -> str:
    default = "" if key.is_section else f" = `{key.raw}`"
    return f"- `{key.path}`{default}: {_md(key.meaning)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--defaults", type=Path, default=DEFAULTS, help="the defaults file (default: %(default)s)"
    )
    parser.add_argument(
        "--output", type=Path, default=OUTPUT, help="the page to write (default: %(default)s)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the page is out of date or a key has no meaning",
    )
    args = parser.parse_args(argv)
    keys = load_keys(args.defaults)
    missing = undocumented(keys)
    if missing:
        print(
            f"error: {len(missing)} keys of {args.defaults} have no comment: " + ", ".join(missing),
            file=sys.stderr,
        )
        return 1
    page = render(keys)
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != page:
            print(f"{args.output} is out of date: run python {GENERATOR}", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(page, encoding="utf-8")
    print(f"wrote {args.output} ({len(keys)} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Test-only: parse each YAML text once per test process.

Composing a config (Hydra) parses ``vissl/config/defaults.yaml`` (1700 lines) with
PyYAML's pure-Python loader every time: about two thirds of a composition. The tests
compose several hundred configs (every shipped config, every docs command, every
integration run), so :func:`install` wraps :meth:`omegaconf.OmegaConf.load` with a cache
keyed by the file's *text*: the same text gives a deep copy of the config parsed the
first time, so no caller ever sees another caller's object, and an edited file (or one a
test writes) is a different key and is parsed anew. Errors are not cached.

Installed by ``tests/conftest.py`` in every test process and by the docs fork server
(``tests/docs/_zygote.py``) before it forks, so its children start with the defaults
parsed. ``VISSL_TEST_YAML_CACHE=0`` turns it off. Nothing in ``vissl/`` uses this.
"""

from __future__ import annotations

import copy
import hashlib
import io
import os
import pathlib
from typing import IO, Any

from omegaconf import DictConfig, ListConfig, OmegaConf

_CACHE: dict[str, DictConfig | ListConfig] = {}


class _NamedText(io.StringIO):
    """The text under the file's name: YAML errors still point at the file."""

    def __init__(self, text: str, name: str) -> None:
        super().__init__(text)
        self.name = name


_ORIGINAL_LOAD = OmegaConf.load
_INSTALLED = False


def _name_of(file_: str | pathlib.Path | IO[Any]) -> str:
    if isinstance(file_, (str, pathlib.Path)):
        return os.path.abspath(file_)
    return str(getattr(file_, "name", "<file>"))


def _text_of(file_: str | pathlib.Path | IO[Any]) -> str | None:
    if isinstance(file_, (str, pathlib.Path)):
        with open(os.path.abspath(file_), encoding="utf-8") as f:
            return f.read()
    read = getattr(file_, "read", None)
    if read is None:
        return None
    text = read()
    return text.decode("utf-8") if isinstance(text, bytes) else text


def _cached_load(file_: str | pathlib.Path | IO[Any]) -> DictConfig | ListConfig:
    text = _text_of(file_)
    if text is None:  # not a file: OmegaConf's own error
        return _ORIGINAL_LOAD(file_)
    key = hashlib.sha1(text.encode("utf-8")).hexdigest()
    cfg = _CACHE.get(key)
    if cfg is None:
        cfg = _ORIGINAL_LOAD(_NamedText(text, _name_of(file_)))
        _CACHE[key] = cfg
    return copy.deepcopy(cfg)


def install() -> None:
    """Route ``OmegaConf.load`` through the cache (idempotent; off with
    ``VISSL_TEST_YAML_CACHE=0``)."""
    global _INSTALLED
    if _INSTALLED or os.environ.get("VISSL_TEST_YAML_CACHE", "1") == "0":
        return
    OmegaConf.load = staticmethod(_cached_load)  # type: ignore[method-assign,assignment]
    _INSTALLED = True


def warm() -> None:
    """Parse the defaults once (the fork server does this before forking)."""
    import vissl.config

    OmegaConf.load(pathlib.Path(vissl.config.__file__).with_name("defaults.yaml"))

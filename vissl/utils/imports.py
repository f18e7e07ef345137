"""Importing plugin modules: a package's own submodules, and user plugins."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import pkgutil
import sys
import traceback
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path

from vissl.errors import ConfigError

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vissl.plugins"

#: vissl's own plugin packages: importing them runs every built-in registration. The
#: plugin importer and the launcher's worker preload both use this one tuple.
VISSL_PLUGIN_PACKAGES: tuple[str, ...] = (
    "vissl.trainer.train_steps",
    "vissl.hooks",
    "vissl.engines",
    "vissl.models",
    "vissl.losses",
    "vissl.data",
    "vissl.meters",
    "vissl.optimizers",
)


def import_submodules(package: str) -> None:
    """Import every non-private submodule of ``package`` so their registrations run."""
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def _import_file(path: Path) -> None:
    resolved = path.resolve()
    # One module name per file, so a second import (another process, another call)
    # finds it in sys.modules instead of registering everything twice.
    name = "vissl_user_plugin_" + "".join(c if c.isalnum() else "_" for c in str(resolved))
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ConfigError(
            f"config.IMPORTS: cannot import {str(path)!r}: not a Python file.",
            "config.IMPORTS",
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def import_plugins(imports: Iterable[str], *, entry_point_group: str = ENTRY_POINT_GROUP) -> None:
    """Import user plugins: installed ``vissl.plugins`` entry points, then ``imports``.

    Args:
        imports: module names (``my_pkg.my_steps``) or paths of ``.py`` files, as listed in
            ``config.IMPORTS``.
        entry_point_group: the entry-point group to load.

    Raises:
        ConfigError: when a listed module or file cannot be found.
    """
    import_vissl_plugins()
    for ep in entry_points(group=entry_point_group):
        logger.debug("loading vissl plugin entry point %s = %s", ep.name, ep.value)
        ep.load()
    for index, item in enumerate(imports):
        try:
            _import_entry(item)
        except ConfigError:
            raise
        except Exception as err:
            raise _plugin_error(index, item, err) from None


def _plugin_error(index: int, item: str, err: Exception) -> ConfigError:
    """A plugin that raised while importing: which entry, then the user's own frames."""
    if isinstance(err, SyntaxError):
        detail = "".join(traceback.format_exception_only(err))
    else:
        frames = [
            f
            for f in traceback.extract_tb(err.__traceback__)
            if not f.filename.startswith("<frozen") and f.filename != __file__
        ]
        detail = "".join(traceback.format_list(frames) + traceback.format_exception_only(err))
    return ConfigError(
        f"config.IMPORTS[{index}] ({item!r}) failed to import:\n{detail.rstrip()}",
        f"config.IMPORTS[{index}]",
    )


def _import_entry(item: str) -> None:
    """Import one ``config.IMPORTS`` entry: a module name or a ``.py`` file."""
    if not isinstance(item, str) or not item:
        raise ConfigError(
            f"config.IMPORTS: every entry must be a module name or a .py path, got {item!r}.",
            "config.IMPORTS",
        )
    if item.endswith(".py") or "/" in item or "\\" in item:
        path = Path(item)
        if not path.is_file():
            raise ConfigError(
                f"config.IMPORTS: file {item!r} does not exist (relative paths are "
                f"resolved from {Path.cwd()}). Fix the path or use a module name.",
                "config.IMPORTS",
            )
        _import_file(path)
    else:
        try:
            importlib.import_module(item)
        except ModuleNotFoundError as err:
            if err.name and item.startswith(err.name):
                raise ConfigError(
                    f"config.IMPORTS: module {item!r} cannot be found on sys.path. "
                    "Install it, add its folder to PYTHONPATH, or give the .py file path.",
                    "config.IMPORTS",
                ) from err
            raise


def import_vissl_plugins() -> None:
    """Import vissl's own plugin packages so every built-in registration exists."""
    for package in VISSL_PLUGIN_PACKAGES:
        importlib.import_module(package)

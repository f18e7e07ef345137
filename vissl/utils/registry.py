"""One generic registry for every kind of vissl plugin.

Each plugin kind (train steps, hooks, losses, trunks, ...) is one ``Registry`` instance.
Registration is by decorator or direct call::

    LOSS_REGISTRY: Registry[type[nn.Module]] = Registry("loss")

    @LOSS_REGISTRY.register("my_loss")
    class MyLoss(nn.Module): ...

    LOSS_REGISTRY.get("my_loss")

Errors are typed and actionable: an unknown name raises :class:`UnknownNameError`
naming the registry, the bad name, the closest registered name and all names; a
duplicate raises :class:`DuplicateNameError` naming the module of the first
registration. Neither uses ``assert``.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from vissl.errors import DuplicateNameError, UnknownNameError

T = TypeVar("T")


@dataclass(frozen=True)
class _Entry(Generic[T]):
    obj: T
    module: str
    qualname: str
    source: str


def _describe(obj: Any) -> tuple[str, str, str]:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    qualname = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    try:
        source = inspect.getsourcefile(obj) or "<unknown file>"
    except (TypeError, OSError):  # builtins, or classes defined in a REPL / notebook
        source = "<unknown file>"
    return module, qualname, source


def closest_match(name: str, candidates: list[str]) -> str | None:
    """The candidate most similar to ``name`` (case-insensitive), or None."""
    if not candidates:
        return None
    lowered = {c.lower(): c for c in candidates}
    best = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.0)
    return lowered[best[0]] if best else None


#: Every registry by its name (the first one created under a name), so lower layers
#: (config validation) can look names up without importing the packages that own them.
_ALL_REGISTRIES: dict[str, Registry[Any]] = {}


def get_registry(name: str) -> Registry[Any] | None:
    """The registry created under ``name`` (``"loss"``, ``"meter"``, ...), if any."""
    return _ALL_REGISTRIES.get(name)


class Registry(Generic[T]):
    """A name -> object map with helpful errors.

    Args:
        name: human-readable name of the plugin kind, used in error messages
            (e.g. ``"train_step"``).
        config_key: the config key that selects entries of this registry, if any;
            named in the unknown-name error so users know what to fix.
        base: optional base class a registered class must subclass.
    """

    def __init__(self, name: str, config_key: str | None = None, base: type | None = None) -> None:
        self.name = name
        self.config_key = config_key
        self.base = base
        self._entries: dict[str, _Entry[T]] = {}
        self._fallbacks: list[Callable[[str], T | None]] = []
        # name lists of the fallbacks, and what each accepts, for errors
        self._fallback_names: list[tuple[Callable[[], list[str]], str]] = []
        _ALL_REGISTRIES.setdefault(name, self)

    # ------------------------------------------------------------------ registration
    @overload
    def register(self, name: str | None = None) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str | None, obj: T, *, force: bool = False) -> T: ...

    def register(
        self, name: str | None = None, obj: T | None = None, *, force: bool = False
    ) -> Any:
        """Register ``obj`` under ``name``; with no ``obj``, return a decorator.

        Args:
            name: the registry key; defaults to the object's ``__name__``.
            obj: the object to register (omit to use as a decorator).
            force: replace an existing entry on purpose instead of raising.
        """
        if obj is None:

            def decorator(o: T) -> T:
                self._add(name, o, force)
                return o

            return decorator
        self._add(name, obj, force)
        return obj

    def _add(self, name: str | None, obj: T, force: bool) -> None:
        key = name if name is not None else getattr(obj, "__name__", None)
        if not isinstance(key, str) or not key:
            raise ValueError(
                f"Cannot register {obj!r} in the {self.name!r} registry: "
                "give a non-empty string name."
            )
        if self.base is not None and not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise TypeError(
                f"Cannot register {obj!r} as {self.name} {key!r}: it must be a "
                f"subclass of {self.base.__module__}.{self.base.__qualname__}."
            )
        module, qualname, source = _describe(obj)
        existing = self._entries.get(key)
        if existing is not None and not force:
            # Re-importing the same definition (a module imported once by path and
            # once by name, or a reload) is not a conflict.
            same = existing.qualname == qualname and (
                existing.module == module or existing.source == source
            )
            if not same:
                raise DuplicateNameError(
                    f"{self.name} {key!r} is already registered by "
                    f"{existing.module}.{existing.qualname} ({existing.source}); "
                    f"cannot register {module}.{qualname} under the same name. "
                    "Pick another name, or pass force=True to replace it on purpose."
                )
        self._entries[key] = _Entry(obj, module, qualname, source)

    def add_fallback(
        self,
        resolver: Callable[[str], T | None],
        names: Callable[[], list[str]] | None = None,
        description: str = "",
    ) -> None:
        """Add a resolver consulted for names that are not registered.

        Used e.g. to accept every torchvision transform or torch loss by name.

        Args:
            resolver: ``name -> object`` or None.
            names: the names the resolver accepts (for the closest-name suggestion of an
                unknown name; a misspelt torchvision transform is suggested its own name).
            description: what the resolver accepts, named in the unknown-name error
                (e.g. ``"every torchvision.transforms class"``).
        """
        self._fallbacks.append(resolver)
        if names is not None:
            self._fallback_names.append((names, description))

    def unregister(self, name: str) -> None:
        """Remove ``name`` (mostly for tests)."""
        self._entries.pop(name, None)

    # ------------------------------------------------------------------ lookup
    def get(self, name: str) -> T:
        """Return the object registered as ``name``.

        Raises:
            UnknownNameError: if nothing is registered under ``name``.
        """
        entry = self._entries.get(name)
        if entry is not None:
            return entry.obj
        for resolve in self._fallbacks:
            found = resolve(name)
            if found is not None:
                return found
        raise UnknownNameError(self.unknown_message(name))

    def unknown_message(self, name: object) -> str:
        names = sorted(self._entries)
        accepted = list(names)
        also = []
        for list_names, description in self._fallback_names:
            try:
                accepted.extend(list_names())
            except Exception:  # (a fallback's library missing: suggest the others)
                continue
            if description:
                also.append(description)
        close = closest_match(str(name), accepted)
        where = f" (set by {self.config_key})" if self.config_key else ""
        hint = f" Did you mean {close!r}?" if close else ""
        plus = f", and {' and '.join(also)}" if also else ""
        return (
            f"Unknown {self.name} {name!r}{where} in the {self.name!r} registry.{hint} "
            f"Registered names: {names}{plus}. If it is your own plugin, make sure the "
            "module that registers it is imported, e.g. by listing it in config.IMPORTS."
        )

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return [(k, self._entries[k].obj) for k in sorted(self._entries)]

    def origin(self, name: str) -> str:
        """Where ``name`` was registered: ``module.qualname (file)``."""
        e = self._entries[name]
        return f"{e.module}.{e.qualname} ({e.source})"

    def __repr__(self) -> str:
        rows = "\n".join(f"  {k}: {self.origin(k)}" for k in self)
        return f"Registry({self.name!r}, {len(self)} entries)\n{rows}"

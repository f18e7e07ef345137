"""Comparing two configs of a run folder: is a new config the run already in the folder?

- :data:`RUN_KEYS`: what a training run *is* (its data, model, loss, optimisation, seed);
  two configs that agree on them, outside :data:`RUNTIME_KEYS` (where and how it runs:
  folder, devices, processes, logging, loader workers), are the same run. A finished run
  of the same config in ``CHECKPOINT.DIR`` has nothing left to do; of another, it is
  refused unless ``CHECKPOINT.OVERWRITE_EXISTING``.
- :data:`MODEL_KEYS`: which model the weights are. A checkpoint written under other values
  is another model's, and ``AUTO_RESUME`` refuses it; the other keys may change between a
  run and its resume (a longer schedule, another learning rate), with a warning naming
  them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import yaml

#: The config sections and keys that make a training run what it is.
RUN_KEYS: tuple[str, ...] = (
    "SEED_VALUE",
    "TEST_MODEL",
    "DATA.TRAIN",
    "DATA.TEST",
    "MODEL",
    "LOSS",
    "OPTIMIZER",
    "TRAINER",
    "METERS",
)

#: Named first when configs differ: what tells two runs apart at a glance.
_FIRST = ("LOSS.name", "MODEL.TRUNK.NAME", "MODEL.HEAD.PARAMS", "OPTIMIZER.num_epochs")

#: Keys inside :data:`RUN_KEYS` that say how or where a run goes, not what it trains.
RUNTIME_KEYS: tuple[str, ...] = (
    "MODEL.CUDA_CACHE",
    "MODEL.COMPILE",
    "MODEL.CHANNELS_LAST",
)

#: Derived from the number of processes by the config inference, not set by the user.
_DERIVED_LEAVES = ("world_size", "effective_batch_size")

#: The keys that decide which model a checkpoint's weights belong to.
MODEL_KEYS: tuple[str, ...] = (
    "LOSS.name",
    "MODEL.BASE_MODEL_NAME",
    "MODEL.TRUNK",
    "MODEL.HEAD.PARAMS",
)

_MISSING = object()


def plain(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """``config`` as plain YAML data (the form in which a checkpoint records it)."""
    if config is None:
        return {}
    data = yaml.safe_load(yaml.safe_dump(_to_builtin(config), sort_keys=False))
    return data if isinstance(data, dict) else {}


def _to_builtin(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _to_builtin(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_builtin(v) for v in value]
    return value


def recorded_config(yaml_text: str | None) -> dict[str, Any] | None:
    """The ``config`` section of a YAML text (a checkpoint's ``config`` entry or
    ``train_config.yaml``), or None when the text holds none."""
    if not yaml_text:
        return None
    try:
        data = yaml.safe_load(yaml_text)
    except yaml.YAMLError:
        return None
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        return data["config"]
    return None


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(node, Mapping) and node:
        for key, value in node.items():
            _flatten(value, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = node


def _select(tree: Mapping[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _ignored(path: str, ignore: Iterable[str]) -> bool:
    if path.startswith("LOSS.") and path.rsplit(".", 1)[-1] in _DERIVED_LEAVES:
        return True
    return any(path == key or path.startswith(key + ".") for key in ignore)


def config_differences(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    keys: Iterable[str] = RUN_KEYS,
    ignore: Iterable[str] = RUNTIME_KEYS,
    defaults: Mapping[str, Any] | None = None,
) -> list[tuple[str, Any, Any]]:
    """``(key path, old value, new value)`` of every leaf under ``keys`` that differs.

    A key that one config lacks (written by another vissl version) counts as its value in
    ``defaults`` (``defaults.yaml``'s ``config`` section by default).
    """
    if defaults is None:
        from vissl.config.validation import default_tree

        defaults = default_tree()
    old, new = plain(old), plain(new)
    ignore = tuple(ignore)
    diffs: list[tuple[str, Any, Any]] = []
    for key in keys:
        flat_old: dict[str, Any] = {}
        flat_new: dict[str, Any] = {}
        flat_default: dict[str, Any] = {}
        for tree, flat in ((old, flat_old), (new, flat_new), (plain(defaults), flat_default)):
            value = _select(tree, key)
            if value is not _MISSING:
                _flatten(value, key, flat)
        for path in sorted(set(flat_old) | set(flat_new)):
            if _ignored(path, ignore):
                continue
            a = flat_old.get(path, flat_default.get(path, _MISSING))
            b = flat_new.get(path, flat_default.get(path, _MISSING))
            if a is _MISSING or b is _MISSING or a == b:
                continue
            diffs.append((path, a, b))
    first = {path: i for i, path in enumerate(_FIRST)}
    return sorted(diffs, key=lambda d: first.get(d[0], len(first)))


def _short(value: Any, width: int = 70) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def format_differences(diffs: list[tuple[str, Any, Any]], limit: int = 6) -> str:
    """``KEY: old -> new; ...`` for the first ``limit`` differences."""
    shown = "; ".join(f"config.{path}: {_short(a)} -> {_short(b)}" for path, a, b in diffs[:limit])
    more = f"; and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return shown + more


def describe_run(config: Mapping[str, Any] | None) -> str:
    """A few words naming what a config trains (loss, trunk, head)."""
    if not config:
        return "an unknown config (none recorded)"
    data = plain(config)
    loss = _select(data, "LOSS.name")
    trunk = _select(data, "MODEL.TRUNK.NAME")
    epochs = _select(data, "OPTIMIZER.num_epochs")
    parts = []
    if loss is not _MISSING:
        parts.append(f"LOSS.name={loss}")
    if trunk is not _MISSING:
        parts.append(f"MODEL.TRUNK.NAME={trunk}")
    if epochs is not _MISSING:
        parts.append(f"OPTIMIZER.num_epochs={epochs}")
    return ", ".join(parts) or "a config without a loss or trunk"

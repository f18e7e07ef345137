"""Hydra composition of configs, then plugin import and validation.

``compose_hydra_configuration(["config=quick_start", "config.LOG_FREQUENCY=5"])`` composes
``vissl/config/defaults.yaml`` with ``configs/config/quick_start.yaml`` and the overrides;
``convert_to_attrdict`` validates the result and returns ``(root, config)`` AttrDicts.
"""

from __future__ import annotations

import difflib
import functools
import logging
import re
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from vissl.config.attr_dict import AttrDict
from vissl.config.derive import infer_loss_config
from vissl.config.validation import (
    _closest_key,
    _get,
    _has,
    _leaf_paths,
    _load_defaults_file,
    default_tree,
    validate_config,
)
from vissl.errors import ConfigError, UnknownKeyError
from vissl.utils.imports import import_plugins

logger = logging.getLogger(__name__)

_OVERRIDE_KEY = re.compile(r"^[+~]{0,2}(config(?:\.[\w\-\[\]]+)+)=")


def _unknown_override(overrides: Sequence[str], err: BaseException) -> UnknownKeyError | None:
    text = str(err)
    for override in overrides:
        m = _OVERRIDE_KEY.match(override)
        if not m:
            continue
        key = m.group(1)
        leaf = key.rsplit(".", 1)[-1]
        if f"'{key}'" in text or (f"Key '{leaf}'" in text and "not in struct" in text):
            path = key[len("config.") :]
            close = _closest_key(path, list(_leaf_paths(default_tree())))
            hint = f" Did you mean config.{close}?" if close else ""
            return UnknownKeyError(
                f"Unknown config key {key} in override {override!r}.{hint} To add a new key "
                f"on purpose, write +{key}=... (it must still be a key vissl knows).",
                key,
            )
    return None


_MISSING_CONFIG = re.compile(r"Could not find '(config/[^']+)'")


def _is_shipped_configs(folder: Path) -> bool:
    return (folder / "__init__.py").is_file() and (folder / "config").is_dir()


def shipped_configs_dir() -> Path | None:
    """The ``configs`` folder shipped with vissl (holding ``config/quick_start.yaml``...).

    Found beside the ``vissl`` package (a checkout, an editable install, or the
    site-packages of an install), else through Python's import system. Not through a bare
    ``import configs``: a ``configs/`` folder of the user's project in the current folder
    (a namespace package, without ``__init__.py``) shadows the shipped package there.
    """
    import vissl

    beside = Path(vissl.__file__).resolve().parent.parent / "configs"
    if _is_shipped_configs(beside):
        return beside
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec("configs", None)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            if _is_shipped_configs(Path(location)):
                return Path(location)
    return None


def config_search_dirs() -> list[Path]:
    """The folders ``config=NAME`` is looked up in: ``configs/config`` of the vissl
    installation and of the current folder (as in VISSL)."""
    shipped = shipped_configs_dir()
    dirs = [Path.cwd() / "configs" / "config"]
    if shipped is not None:
        dirs.insert(0, shipped / "config")
    seen: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [x.resolve() for x in seen]:
            seen.append(d)
    return seen


def available_config_names() -> list[str]:
    """Every name ``config=`` accepts: the .yaml files under the search folders."""
    names = {
        str(f.relative_to(d).with_suffix(""))
        for d in config_search_dirs()
        for f in d.rglob("*.yaml")
    }
    return sorted(names)


def _missing_config_error(err: MissingConfigException, overrides: Sequence[str]) -> ConfigError:
    """One line: which config is missing, the closest names, where configs are looked up."""
    m = _MISSING_CONFIG.search(str(err))
    if m is None:
        return ConfigError(f"config composition failed: {str(err).splitlines()[0]}", "config")
    missing = m.group(1)
    name = missing.removeprefix("config/")
    names = available_config_names()
    base = name.removesuffix(".yaml")
    close = difflib.get_close_matches(base, names, n=3, cutoff=0.0)
    by_file = {n for n in names if Path(n).name == Path(base).name}
    close = sorted(by_file) + [c for c in close if c not in by_file]
    hint = f" Closest: {', '.join(close[:3])}." if close else ""
    where = " and ".join(str(d) for d in config_search_dirs())
    given = [o for o in overrides if o.lstrip("+~") == f"config={name}"]
    what = (
        given[0]
        if given
        else f"the config {missing!r} (named in a defaults list or a +config/ override)"
    )
    return ConfigError(
        f"{what}: no such config (looked up as <name>.yaml under {where}).{hint} "
        "Pass config=<path under configs/config without .yaml>, e.g. config=quick_start.",
        "config",
    )


def _yaml_error(err: yaml.YAMLError) -> ConfigError:
    """A YAML syntax error as one line: file, line and column, and the problem."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    hint = " (YAML indents with spaces, not tabs)" if "\\t" in problem else ""
    if mark is None:
        return ConfigError(f"YAML syntax error in a config: {problem}{hint}", "config")
    return ConfigError(
        f"{mark.name}:{mark.line + 1}:{mark.column + 1}: YAML syntax error: {problem}{hint}",
        "config",
    )


def _open_mapping_overrides(overrides: Sequence[str]) -> list[str]:
    """``config.K={...}`` for a key ``K`` whose default is an empty mapping (an open set of
    keyword arguments: ``MODEL.TRUNK.TIMM.KWARGS``, ``COLLATE_FUNCTION_PARAMS``, ...)
    becomes ``++config.K={...}``: Hydra merges a dict override into the node, and the
    struct flag of the composed config refuses the new keys of an empty one."""
    tree = default_tree()
    out = []
    for override in overrides:
        m = _OVERRIDE_KEY.match(override)
        if m and not override.startswith(("+", "~")):
            path = m.group(1)[len("config.") :]
            value = override[m.end() :].lstrip()
            if value.startswith("{") and _has(tree, path):
                node = _get(tree, path)
                if isinstance(node, Mapping) and not node:
                    override = "++" + override
        out.append(override)
    return out


def _search_path_override() -> list[str]:
    """``hydra.searchpath`` naming the shipped configs by their folder, not as
    ``pkg://configs``, which a ``configs/`` folder in the current folder shadows."""
    shipped = shipped_configs_dir()
    if shipped is None or "'" in str(shipped):
        return []  # defaults.yaml's pkg://configs and file://configs
    return [f"hydra.searchpath=['file://{shipped}','file://configs']"]


# ---------------------------------------------------------------------- list entries
# A list of components (DATA.<split>.TRANSFORMS, HOOKS.CUSTOM_HOOKS, MODEL.HEAD.PARAMS, ...)
# is addressed by index (config.DATA.TRAIN.TRANSFORMS.1.size=32) or by the entry's name
# (config.DATA.TRAIN.TRANSFORMS.RandomResizedCrop.size=32): the name is resolved to its
# index against the composed config. A bad index or name is an error listing the entries.

_OVERRIDE_PARTS = re.compile(r"^(?P<prefix>[+~]{0,2})config\.(?P<path>[^=]+)=(?P<value>.*)$", re.S)


@functools.lru_cache(maxsize=1)
def _list_keys() -> frozenset[str]:
    """Key paths (under ``config``) whose default is a list."""
    tree = _load_defaults_file()["config"]
    return frozenset(p for p in _leaf_paths(tree) if isinstance(_get(tree, p), list))


def _list_step(path: str) -> tuple[str, str, list[str]] | None:
    """``(list key, entry segment, the rest)`` when ``path`` goes into a list entry."""
    parts = path.split(".")
    keys = _list_keys()
    for i in range(1, len(parts)):
        head = ".".join(parts[:i])
        if head in keys:
            return head, parts[i], parts[i + 1 :]
    return None


def _entry_name(entry: Any) -> str | None:
    if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
        return str(entry["name"])
    if isinstance(entry, list | tuple) and entry and isinstance(entry[0], str):
        return str(entry[0])
    return None


def _entry_args(entry: Any) -> Mapping[str, Any]:
    if isinstance(entry, Mapping):
        return {k: v for k, v in entry.items() if k != "name"}
    if isinstance(entry, list | tuple) and len(entry) > 1 and isinstance(entry[1], Mapping):
        return entry[1]
    return {}


def describe_entries(entries: Sequence[Any], width: int = 60) -> str:
    """``[0] ImgReplicatePil (num_times=2), [1] RandomResizedCrop (size=8, ...)``."""
    out = []
    for i, entry in enumerate(entries):
        args = ", ".join(f"{k}={v!r}" for k, v in _entry_args(entry).items())
        if len(args) > width:
            args = args[: width - 3] + "..."
        name = _entry_name(entry) or repr(entry)[:width]
        out.append(f"[{i}] {name}" + (f" ({args})" if args else ""))
    return ", ".join(out) if out else "(none: the list is empty)"


def _plain_list(composed: DictConfig, key: str) -> list[Any] | None:
    node = OmegaConf.select(composed, f"config.{key}")
    if node is None:
        return None
    value = OmegaConf.to_container(node, resolve=False)
    return value if isinstance(value, list) else None


def _entry_error(override: str, key: str, message: str, example: str) -> ConfigError:
    return ConfigError(
        f"{override!r}: {message} Address an entry by its index "
        f"(config.{key}.<index>.<argument>=...) or by its name "
        f"(config.{key}.<name>.<argument>=..., e.g. {example}); add an argument the entry "
        "does not set yet with a leading +.",
        f"config.{key}",
    )


#: Arguments an example names first: the crop sizes, which users change most.
_EXAMPLE_ARGS = ("size", "size_crops", "crop_size")


def _example(key: str, entries: Sequence[Any]) -> str:
    candidates = [(_entry_name(e), _entry_args(e)) for e in entries]
    for wanted in (*_EXAMPLE_ARGS, None):
        for name, args in candidates:
            arg = wanted if wanted in args else (next(iter(args), None) if wanted is None else None)
            if name and arg is not None:
                return f"config.{key}.{name}.{arg}={args[arg]!r}".replace("'", "")
    return f"config.{key}.0.name=..."


def _resolve_named_entries(overrides: list[str], compose_fn: Any) -> list[str]:
    """Overrides that name a list entry (``TRANSFORMS.RandomResizedCrop.size=32``) with
    the name replaced by its index in the config composed from the other overrides."""
    named: dict[int, tuple[str, str, str, str, list[str], str]] = {}
    for i, override in enumerate(overrides):
        m = _OVERRIDE_PARTS.match(override)
        step = _list_step(m.group("path")) if m else None
        if m and step and not step[1].lstrip("-").isdigit():
            named[i] = (m.group("prefix"), m.group("value"), *step[:2], step[2], override)
    if not named:
        return overrides
    base = compose_fn([o for i, o in enumerate(overrides) if i not in named])
    out = list(overrides)
    for i, (prefix, value, key, name, rest, override) in named.items():
        entries = _plain_list(base, key) or []
        found = [j for j, entry in enumerate(entries) if _entry_name(entry) == name]
        if len(found) != 1:
            what = (
                f"config.{key} has no entry named {name!r}"
                if not found
                else f"config.{key} has {len(found)} entries named {name!r} ({found}): "
                "use the index of the one you mean"
            )
            raise _entry_error(
                override,
                key,
                f"{what}; its entries: {describe_entries(entries)}.",
                _example(key, entries),
            )
        out[i] = f"{prefix}config.{'.'.join([key, str(found[0]), *rest])}={value}"
        logger.debug("override %r addresses config.%s.%d", override, key, found[0])
    return out


def _bad_entry_error(overrides: Sequence[str], compose_fn: Any) -> ConfigError | None:
    """The error of an override whose list index is out of range, or whose entry has no
    such argument (naming what is at each index); None when no override is one."""
    for override in overrides:
        m = _OVERRIDE_PARTS.match(override)
        step = _list_step(m.group("path")) if m else None
        if not m or not step or not step[1].lstrip("-").isdigit():
            continue
        key, index_text, rest = step
        try:
            base = compose_fn([o for o in overrides if o != override])
        except Exception:
            continue
        entries = _plain_list(base, key)
        if entries is None:
            continue
        index = int(index_text)
        example = _example(key, entries)
        if not 0 <= index < len(entries):
            return _entry_error(
                override,
                key,
                f"config.{key} has {len(entries)} entries, so there is no index {index}; "
                f"its entries: {describe_entries(entries)}.",
                example,
            )
        args = _entry_args(entries[index])
        if (
            rest
            and not rest[0].isdigit()
            and rest[0] not in args
            and rest[0] != "name"
            and "+" not in m.group("prefix")
        ):
            name = _entry_name(entries[index]) or "this entry"
            return _entry_error(
                override,
                key,
                f"config.{key}.{index} is {name}, which does not set {rest[0]!r} (it sets "
                f"{sorted(args) or 'no arguments'}); its entries: {describe_entries(entries)}.",
                example,
            )
    return None


def compose_hydra_configuration(overrides: Sequence[str]) -> DictConfig:
    """Compose the defaults with ``config=NAME``, ``+config/group/sub=file`` and overrides.

    ``config=NAME`` is looked up in the configs shipped with vissl, then in
    ``./configs/config`` of the current folder (see :func:`config_search_dirs`).

    Raises:
        ConfigError: no ``config=``, a config name that does not exist, or an override of
            an unknown key (with the closest valid key).
    """
    overrides = _open_mapping_overrides(overrides)
    if not any(o.lstrip("+~").startswith("hydra.searchpath") for o in overrides):
        overrides = [*overrides, *_search_path_override()]
    overrides = _resolve_named_entries(overrides, _compose)
    return _compose(overrides, explain_entries=True)


def _compose(overrides: Sequence[str], explain_entries: bool = False) -> DictConfig:
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    try:
        with warnings.catch_warnings():
            # `file://configs` is only there when running from a checkout; not an error.
            warnings.filterwarnings("ignore", message=r"provider=hydra.searchpath.*not available")
            with initialize_config_module(config_module="vissl.config", version_base=None):
                return compose("defaults", overrides=list(overrides))
    except MissingConfigException as err:
        raise _missing_config_error(err, overrides) from None
    except yaml.YAMLError as err:
        raise _yaml_error(err) from None
    except (ConfigCompositionException, MissingMandatoryValue) as err:
        entry = _bad_entry_error(overrides, _compose) if explain_entries else None
        if entry is not None:
            raise entry from None
        unknown = _unknown_override(overrides, err) or _unknown_override(
            overrides, err.__cause__ or err
        )
        if unknown is not None:
            raise unknown from err
        if "config" in str(err) and not any(o.startswith("config=") for o in overrides):
            raise ConfigError(
                "No config given: pass config=<name under configs/config without .yaml>, "
                "e.g. `python tools/run_distributed_engines.py config=quick_start`.",
                "config",
            ) from err
        raise ConfigError(f"config composition failed: {err}", "config") from err


def _infer(config: dict[str, Any]) -> None:
    """Fill values VISSL infers (informational; components re-derive what they need)."""
    dist = config["DISTRIBUTED"]
    world_size = int(dist["NUM_NODES"]) * int(dist["NUM_PROC_PER_NODE"])
    simclr = config["LOSS"].get("simclr_info_nce_loss")
    if isinstance(simclr, dict) and isinstance(simclr.get("buffer_params"), dict):
        simclr["buffer_params"]["world_size"] = world_size
        simclr["buffer_params"]["effective_batch_size"] = (
            2 * world_size * int(config["DATA"]["TRAIN"]["BATCHSIZE_PER_REPLICA"])
        )
    bce = config["LOSS"].get("bce_logits_multiple_output_single_target")
    if isinstance(bce, dict):
        bce["world_size"] = world_size


def _infer_sharded_ddp(config: dict[str, Any]) -> None:
    """VISSL's ``MODEL.SHARDED_DDP_SETUP.USE_SDP``: the ShardedDDP task, with the optimizer
    state sharded (here DDP with ``ZeroRedundancyOptimizer``, see vissl/optimizers/zero.py)."""
    setup = (config.get("MODEL") or {}).get("SHARDED_DDP_SETUP") or {}
    if not setup.get("USE_SDP"):
        return
    from vissl.optimizers.zero import SDP_TASK_NAME

    logger.info(
        "config.MODEL.SHARDED_DDP_SETUP.USE_SDP: TRAINER.TASK_NAME=%s, OPTIMIZER.use_zero=True",
        SDP_TASK_NAME,
    )
    config["TRAINER"]["TASK_NAME"] = SDP_TASK_NAME
    config["OPTIMIZER"]["use_zero"] = True


_LIST_METERS = (
    "accuracy_list_meter",
    "precision_at_k_list_meter",
    "recall_at_k_list_meter",
    "mean_ap_list_meter",
)


def _infer_list_meters(config: dict[str, Any]) -> None:
    """VISSL's rule for linear evaluation of several layers: one list-meter output per
    entry of LINEAR_EVAL_FEAT_POOL_OPS_MAP, named after the layer (``res4``...), so that
    metrics.json reads ``{"top_1": {"res4": ...}}`` even when the config gives only
    ``num_meters`` (as VISSL's benchmark configs do)."""
    model = config.get("MODEL") or {}
    fe = model.get("FEATURE_EVAL_SETTINGS") or {}
    pool_map = fe.get("LINEAR_EVAL_FEAT_POOL_OPS_MAP") or []
    frozen = fe.get("FREEZE_TRUNK_ONLY") or fe.get("FREEZE_TRUNK_AND_HEAD")
    if not (fe.get("EVAL_MODE_ON") and frozen and pool_map):
        return
    meters = config.get("METERS") or {}
    names = meters.get("names") or []
    if isinstance(names, str):
        names = [names]
    if meters.get("name"):
        names = [*names, meters["name"]]
    layers = [str(item[0]) if isinstance(item, list | tuple) and item else "" for item in pool_map]
    for name in names:
        params = meters.get(name)
        if name not in _LIST_METERS or not isinstance(params, dict):
            continue
        if params.get("num_meters") != len(layers):
            logger.info(
                "config.METERS.%s.num_meters set to %d, one per layer of "
                "LINEAR_EVAL_FEAT_POOL_OPS_MAP (was %s)",
                name,
                len(layers),
                params.get("num_meters"),
            )
            params["num_meters"] = len(layers)
        if not params.get("meter_names") and all(layers):
            params["meter_names"] = layers


def convert_to_attrdict(
    cfg: DictConfig | dict[str, Any], cmdline_args: Sequence[str] | None = None
) -> tuple[AttrDict, AttrDict]:
    """Validate a composed config; return ``(root, root.config)`` as AttrDicts.

    The modules in ``config.IMPORTS`` (and ``vissl.plugins`` entry points) are imported first,
    so user plugins can register names and config keys before validation.
    """
    if isinstance(cfg, DictConfig):
        container = OmegaConf.to_container(cfg, resolve=True)
    else:
        container = dict(cfg)
    assert isinstance(container, dict)
    container.pop("hydra", None)
    config = container.get("config")
    if not isinstance(config, dict):
        raise ConfigError("the composed config has no `config:` section", "config")
    import_plugins(config.get("IMPORTS") or [])
    validate_config(config)
    _infer(config)
    _infer_sharded_ddp(config)
    _infer_list_meters(config)
    # What the loss infers from the rest of the config, written once, here: the saved
    # config (train_config.yaml, the checkpoints') is what the loss is built from. A
    # config the loss refuses is left as it is: building the loss reports the error, with
    # its key path, where it always did.
    try:
        infer_loss_config(config)
    except Exception as err:
        logger.debug("the loss's inference refused the config (the build reports it): %s", err)
    root = AttrDict(container)
    return root, root.config


def hydra_compose_and_validate(overrides: Sequence[str]) -> tuple[AttrDict, AttrDict]:
    """``compose_hydra_configuration`` followed by ``convert_to_attrdict``."""
    return convert_to_attrdict(compose_hydra_configuration(overrides), overrides)


def config_to_yaml(config: AttrDict | dict[str, Any]) -> str:
    """The resolved config as YAML text (``train_config.yaml``)."""
    plain = config.to_dict() if isinstance(config, AttrDict) else config
    return yaml.safe_dump({"config": plain}, sort_keys=False)

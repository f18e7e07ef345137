"""Validation of the composed config, run once before anything is built.

- An unknown key (from YAML or a ``+`` override) stops the run with its full key path and
  the closest valid key.
- A key VISSL knows that vissl does not implement yet gives a warning naming it.
- Legacy VISSL layouts (``MODEL.TRUNK.TRUNK_PARAMS``, top-level ``MONITOR_PERF_STATS``)
  are moved to their current keys, with a warning.
- Wrong types and impossible values stop the run with the key path.

Plugins may declare config keys of their own with :func:`register_config_defaults`.
"""

from __future__ import annotations

import copy
import difflib
import functools
import logging
import os
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from vissl.errors import ConfigError, UnknownKeyError, UnsupportedConfigWarning
from vissl.utils.registry import get_registry

logger = logging.getLogger(__name__)

DEFAULTS_PATH = Path(__file__).with_name("defaults.yaml")


# Subtrees whose content is free-form (validated by the component that reads them).
OPEN_SUBTREES = {
    "OPTIMIZER.param_schedulers",
    "MODEL.TRUNK.REGNET",
    "MODEL.TRUNK.TIMM.KWARGS",
    # msn's drop_ratio / global_view_tokens (checked by the vision_transformer trunk)
    "MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.PARAMS",
    "MODEL.AMP_PARAMS.AMP_ARGS",
    "SLURM.ADDITIONAL_PARAMETERS",
    "DATA.TRAIN.COLLATE_FUNCTION_PARAMS",
    "DATA.TEST.COLLATE_FUNCTION_PARAMS",
}

# Keys whose values may take several types.
POLYMORPHIC = {
    "MODEL.GRAD_CLIP.NORM_TYPE": (int, float, str),
    "MODEL.GRAD_CLIP.MAX_NORM": (int, float),
    "MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER": (int, float),
    # one key, or a list of nested keys (e.g. [classy_state_dict, loss])
    "MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME": (str, list),
    # False: 1/sqrt(head dim); a number: that scale
    "MODEL.TRUNK.VISION_TRANSFORMERS.QK_SCALE": (bool, int, float),
    # False: no layer scale; a number: its initial value
    "MODEL.TRUNK.BEIT.INIT_VALUES": (bool, int, float),
    # layer scale of vision_transformer: False (off) or its initial value (DINOv2: 1e-5)
    "MODEL.TRUNK.VISION_TRANSFORMERS.INIT_VALUES": (bool, int, float),
    "DISTRIBUTED.NCCL_SOCKET_NTHREADS": (int, str),
    "DISTRIBUTED.RUN_ID": (str, int),
    "LOSS.cross_entropy_multiple_output_single_target.weight": (list, type(None)),
    "SLURM.TIME_HOURS": (int, float),
    "SLURM.MEM_GB": (int, float),
    "OPTIMIZER.momentum": (int, float),
    "OPTIMIZER.weight_decay": (int, float),
    # one k or several (VISSL evaluates each k of a list)
    "NEAREST_NEIGHBOR.TOPK": (int, list),
    "NEAREST_NEIGHBOR.SIGMA": (int, float),
    # one strength or several (VISSL accepts both)
    "LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.LAMBDA": (int, float, list),
}

#: ``TRAINER.TASK_NAME`` values (VISSL's names): DDP, FSDP2 (vissl/trainer/fsdp.py), and
#: ShardedDDP (DDP with ZeroRedundancyOptimizer here, vissl/optimizers/zero.py).
TASK_NAMES = ("self_supervision_task", "self_supervision_fsdp_task", "self_supervision_sdp_task")

# Keys of sections VISSL has and vissl does not implement yet (any key below them).
VISSL_UNSUPPORTED_PREFIXES = (
    "MONITORING",
    "GEO_LOCALIZATION",
    "DISTILLATION",
    "EXTRACT_FEATURES.MAP_FEATURES_TO_IMG_NAME",
    "DATA.TRAIN.STRATIFIED_SAMPLER",
    "DATA.TEST.STRATIFIED_SAMPLER",
    "DATA.TRAIN.POWER_LAW_SAMPLER",
    "DATA.TEST.POWER_LAW_SAMPLER",
    "DATA.TRAIN.TRANSFORMS_AUGLY",
    "METERS.model_output_mask",
    "LOSS.distillation_loss",
    "LOSS.swav_distillation_loss",
    "LOSS.dino_distillation_loss",
    "LOSS.msn_distillation_loss",
    "LOSS.ibot_distillation_loss",
)

# The table of keys in defaults.yaml that are accepted but not implemented (key path ->
# the inert value): a config setting one to anything else gets a warning naming it when
# the config is validated, at start. Remove an entry when its feature lands.
NOT_IMPLEMENTED: dict[str, Any] = {
    **{
        f"DATA.{split}.{key}": value
        for split in ("TRAIN", "TEST")
        for key, value in {
            "COPY_TO_LOCAL_DISK": False,
            "COPY_DESTINATION_DIR": "",
            "ENABLE_QUEUE_DATASET": False,
            "USE_DEBUGGING_SAMPLER": False,
            "BASE_DATASET": "generic_ssl",
        }.items()
    },
    # apex's O2/O3 (half-precision weights) have no torch AMP equivalent; O1 is autocast.
    "MODEL.AMP_PARAMS.AMP_ARGS.opt_level": "O1",
    "CHECKPOINT.BACKEND": "disk",
    # tools/instance_retrieval_test.py runs the model itself, image by image, and scores
    # the revisited sets in Python
    "IMG_RETRIEVAL.USE_FEATURE_EXTRACTION_ENGINE": False,
    "IMG_RETRIEVAL.FEATURE_EXTRACTION_DIR": "",
    "IMG_RETRIEVAL.EVAL_BINARY_PATH": "",
    # VISSL's own vision_transformer left hybrid (CNN stem) backbones as a TODO
    "MODEL.TRUNK.VISION_TRANSFORMERS.HYBRID": None,
    # vissl's synthetic source always draws learnable random images (VISSL's True)
    "DATA.TRAIN.RANDOM_SYNTHETIC_IMAGES": True,
    "DATA.TEST.RANDOM_SYNTHETIC_IMAGES": True,
}

# Keys some of VISSL's own configs set that VISSL itself never reads (key path -> why):
# dropped with a warning, so that those configs run unchanged and as they did in VISSL.
VISSL_IGNORED_KEYS: dict[str, str] = {
    "DATA.TRANSFORMS": "a split's transforms are DATA.TRAIN.TRANSFORMS / "
    "DATA.TEST.TRANSFORMS (move the list there to use it).",
    "LOSS.ignore_index": "a loss reads its own block, e.g. "
    "LOSS.cross_entropy_multiple_output_single_target.ignore_index (default -1).",
    "MODEL.TRUNK.VISION_TRANSFORMERS.CONVIT": "the convit trunk reads MODEL.TRUNK.CONVIT.",
    "MODEL.WEIGHTS_INIT.PARAM_FILE": "it is a misspelling of PARAMS_FILE; no weights are "
    "loaded from it (give MODEL.WEIGHTS_INIT.PARAMS_FILE).",
}

# Keys whose null means "the default" (VISSL's configs often carry null there).
NULLABLE = {
    "HOOKS.TENSORBOARD_SETUP.LOG_DIR",
    "HOOKS.TENSORBOARD_SETUP.EXPERIMENT_LOG_DIR",
}

_EXTRA_DEFAULTS: dict[str, Any] = {}


def register_config_defaults(key_path: str, default: Any) -> None:
    """Declare a config key (or subtree) of your own plugin, e.g. from a module in IMPORTS.

    Example: ``register_config_defaults("LOSS.my_loss", {"temperature": 0.1})`` makes
    ``config.LOSS.my_loss.temperature`` a valid key with that default.
    """
    _EXTRA_DEFAULTS[key_path] = copy.deepcopy(default)


@functools.lru_cache(maxsize=1)
def _load_defaults_file() -> dict[str, Any]:
    with open(DEFAULTS_PATH, encoding="utf-8") as f:
        return yaml.safe_load(f)  # type: ignore[no-any-return]


def default_tree() -> dict[str, Any]:
    """The default ``config:`` tree, with plugin-declared defaults merged in."""
    tree = copy.deepcopy(_load_defaults_file()["config"])
    for path, value in _EXTRA_DEFAULTS.items():
        node = tree
        parts = path.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        if isinstance(node.get(parts[-1]), dict) and isinstance(value, dict):
            node[parts[-1]] = {**value, **node[parts[-1]]}
        else:
            node.setdefault(parts[-1], copy.deepcopy(value))
    return tree


def _leaf_paths(tree: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, Mapping) and path not in OPEN_SUBTREES:
            yield from _leaf_paths(value, path + ".")


def _closest_key(path: str, valid: list[str]) -> str | None:
    parent, _, leaf = path.rpartition(".")
    siblings = [v for v in valid if v.rpartition(".")[0] == parent]
    names = [v.rpartition(".")[2] for v in siblings]
    lowered = {n.lower(): n for n in names}
    best = difflib.get_close_matches(leaf.lower(), list(lowered), n=1, cutoff=0.5)
    if best:
        return f"{parent}.{lowered[best[0]]}" if parent else lowered[best[0]]
    match = difflib.get_close_matches(path, valid, n=1, cutoff=0.6)
    return match[0] if match else None


def _is_unsupported_vissl_key(path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in VISSL_UNSUPPORTED_PREFIXES)


def _dynamic_section_ok(path: str) -> bool:
    """``LOSS.<name>`` and ``METERS.<name>`` are valid for registered names (any content)."""
    parts = path.split(".")
    if len(parts) < 2:
        return False
    # Registries are looked up by name: config/ does not import the plugin packages
    # (they are imported, with the user's plugins, before validation runs).
    if parts[0] == "LOSS":
        losses = get_registry("loss")
        if losses is not None and parts[1] in losses:
            return True
        import torch.nn as nn

        obj = getattr(nn, parts[1], None)
        return isinstance(obj, type) and issubclass(obj, nn.Module)
    if parts[0] == "METERS":
        meters = get_registry("meter")
        return meters is not None and parts[1] in meters
    return False


def _get(tree: Mapping[str, Any], path: str) -> Any:
    node: Any = tree
    for p in path.split("."):
        node = node[p]
    return node


def _has(tree: Mapping[str, Any], path: str) -> bool:
    node: Any = tree
    for p in path.split("."):
        if not isinstance(node, Mapping) or p not in node:
            return False
        node = node[p]
    return True


def _warn(message: str) -> None:
    warnings.warn(message, UnsupportedConfigWarning, stacklevel=3)


# ---------------------------------------------------------------------- legacy layouts
def upgrade_legacy_keys(cfg: dict[str, Any]) -> None:
    """Move VISSL's older key layouts to the current keys, in place, with a warning."""
    model = cfg.get("MODEL") or {}
    trunk = model.get("TRUNK") or {}
    legacy = trunk.pop("TRUNK_PARAMS", None) if isinstance(trunk, dict) else None
    if isinstance(legacy, dict):
        for family, params in legacy.items():
            _warn(
                f"config.MODEL.TRUNK.TRUNK_PARAMS.{family} is VISSL's old layout: using it as "
                f"config.MODEL.TRUNK.{family}. Move the block there to silence this warning."
            )
            current = trunk.get(family)
            if isinstance(current, dict) and isinstance(params, dict):
                current.update(params)
            else:
                trunk[family] = params
    distributed = cfg.get("DISTRIBUTED")
    if isinstance(distributed, dict) and "DISTR_ON" in distributed:
        # An early VISSL key, still in VISSL 0.1.6's quick_deepcluster_v2.yaml; VISSL 0.1.6
        # itself ignores it (it is not in its defaults either).
        distributed.pop("DISTR_ON")
        _warn(
            "config.DISTRIBUTED.DISTR_ON is an old VISSL key that VISSL 0.1.6 ignores too: "
            "ignored (the processes come from DISTRIBUTED.NUM_NODES x NUM_PROC_PER_NODE)."
        )
    for path, reason in VISSL_IGNORED_KEYS.items():
        *parents, leaf = path.split(".")
        node: Any = cfg
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node:
            node.pop(leaf)
            _warn(f"config.{path} is ignored, as VISSL ignores it: {reason}")
    svm_path = cfg.pop("SVM_FEATURES_PATH", None)
    if svm_path:
        cfg.setdefault("SVM", {}).setdefault("FEATURES", {})["PATH"] = svm_path
        _warn("config.SVM_FEATURES_PATH is VISSL main's key: using it as config.SVM.FEATURES.PATH.")
    if "MONITOR_PERF_STATS" in cfg:
        value = cfg.pop("MONITOR_PERF_STATS")
        _warn(
            "config.MONITOR_PERF_STATS is VISSL's old key: using it as "
            "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS."
        )
        cfg.setdefault("HOOKS", {}).setdefault("PERF_STATS", {})["MONITOR_PERF_STATS"] = value
    if cfg.get("METERS", {}) is None:
        cfg["METERS"] = copy.deepcopy(default_tree()["METERS"])
    meters = cfg.get("METERS") or {}
    if isinstance(meters, dict) and meters.get("name") and not meters.get("names"):
        meters["names"] = [meters["name"]]


# ---------------------------------------------------------------------- keys and types
def check_keys(cfg: Mapping[str, Any]) -> None:
    """Raise on unknown keys, warn on VISSL keys that are not implemented."""
    defaults = default_tree()
    valid = list(_leaf_paths(defaults))
    valid_set = set(valid)

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            if path not in valid_set:
                if _is_unsupported_vissl_key(path):
                    _warn(
                        f"config.{path} is a VISSL key that vissl does not implement yet; "
                        "it is ignored."
                    )
                    continue
                if _dynamic_section_ok(path):
                    continue
                close = _closest_key(path, valid)
                hint = f" Did you mean config.{close}?" if close else ""
                raise UnknownKeyError(
                    f"Unknown config key config.{path}.{hint} Valid keys are listed in "
                    "vissl/config/defaults.yaml; plugins can declare their own with "
                    "vissl.config.register_config_defaults.",
                    f"config.{path}",
                )
            if isinstance(value, Mapping) and path not in OPEN_SUBTREES:
                default = _get(defaults, path)
                if isinstance(default, Mapping):
                    walk(value, path + ".")

    walk(cfg, "")


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return t.__name__


def check_types(cfg: Mapping[str, Any]) -> None:
    """Raise ConfigError where a value's type differs from its default's."""
    defaults = default_tree()
    for path in _leaf_paths(defaults):
        if not _has(cfg, path):
            continue
        default = _get(defaults, path)
        value = _get(cfg, path)
        if default is None or (value is None and path in NULLABLE):
            continue
        expected: type | tuple[type, ...]
        if path in POLYMORPHIC:
            expected = POLYMORPHIC[path]
        elif isinstance(default, bool):
            expected = bool
        elif isinstance(default, int):
            expected = int
        elif isinstance(default, float):
            expected = (int, float)
        elif isinstance(default, str):
            expected = str
        elif isinstance(default, list):
            expected = list
        elif isinstance(default, dict):
            expected = dict
        else:
            continue
        ok = isinstance(value, expected)
        if isinstance(value, bool) and expected in (int, (int, float)):
            ok = False
        if not ok:
            raise ConfigError(
                f"config.{path} must be {_type_name(expected)}, got {type(value).__name__} "
                f"({value!r}).",
                f"config.{path}",
            )


# ---------------------------------------------------------------------- values
#: ``MODEL.GRAD_CLIP.MODE`` values (vissl/hooks/grad_clip_hooks.py)
GRAD_CLIP_MODES = ("global", "per_parameter", "per_module")

_CHOICES = {
    "MACHINE.DEVICE": ("cpu", "gpu"),
    "MULTI_PROCESSING_METHOD": ("fork", "forkserver", "spawn"),
    "DISTRIBUTED.INIT_METHOD": ("tcp", "file", "env"),
    "DISTRIBUTED.BACKEND": ("nccl", "gloo", "mpi"),
    "DATA.TRAIN.LABEL_TYPE": ("standard", "sample_index", "zero"),
    "DATA.TEST.LABEL_TYPE": ("standard", "sample_index", "zero"),
    "MODEL.AMP_PARAMS.AMP_TYPE": ("pytorch", "apex"),
    "MODEL.AMP_PARAMS.AMP_DTYPE": ("float16", "bfloat16", "fp16", "bf16"),
    "MODEL.GRAD_CLIP.MODE": GRAD_CLIP_MODES,
    "MODEL.COMPILE.MODE": (
        "default",
        "reduce-overhead",
        "max-autotune",
        "max-autotune-no-cudagraphs",
    ),
}

_MIN = {
    "LOG_FREQUENCY": 1,
    "TEST_EVERY_NUM_EPOCH": 1,
    "DATA.NUM_DATALOADER_WORKERS": 0,
    "DATA.TRAIN.BATCHSIZE_PER_REPLICA": 1,
    "DATA.TEST.BATCHSIZE_PER_REPLICA": 1,
    "OPTIMIZER.num_epochs": 1,
    "OPTIMIZER.GRAD_ACCUMULATION_STEPS": 1,
    "PROFILING.NUM_ITERATIONS": 1,
    "PROFILING.START_ITERATION": 0,
    "OPTIMIZER.weight_decay": 0,
    "OPTIMIZER.momentum": 0,
    "DISTRIBUTED.NUM_NODES": 1,
    "DISTRIBUTED.NUM_PROC_PER_NODE": 1,
    "CHECKPOINT.CHECKPOINT_FREQUENCY": 1,
    "CHECKPOINT.LATEST_CHECKPOINT_RESUME_FILE_NUM": 1,
    "HOOKS.PERF_STATS.PERF_STAT_FREQUENCY": -1,
}

_DISK_SOURCES = ("disk_folder", "disk_filelist")


def ignored_path_error(split: str, index: int, source: str, path: Any) -> ConfigError:
    """``DATA_PATHS[index]`` given for a data source that reads no path (``digits``,
    ``synthetic``): the run would silently train on that source instead."""
    key = f"config.DATA.{split}.DATA_PATHS"
    return ConfigError(
        f"{key}[{index}]={path!r} is set, but the data source at "
        f"config.DATA.{split}.DATA_SOURCES[{index}] is {source!r}, which reads no path: the "
        f"path would be ignored and the run would train on {source!r}. To train on your "
        f"images, set config.DATA.{split}.DATA_SOURCES=[disk_folder] (a folder of "
        "<class>/<image> files) or [disk_filelist] (a .npy list of image paths); to train "
        f"on {source!r}, leave {key} empty.",
        f"{key}[{index}]",
    )


def _check_ignored_paths(split: str, sources: list[Any], paths: list[Any]) -> None:
    """A path for a source that reads none is an error (see :func:`ignored_path_error`).

    Sources are looked up in the data-source registry when it exists (the plugin
    packages are imported before validation); a source it does not know is left to the
    data set, which names the registered ones.
    """
    registry = get_registry("data source")
    if registry is None:
        return
    for i, (source, path) in enumerate(zip(sources, paths, strict=False)):
        if not path or not isinstance(source, str) or source not in registry:
            continue
        if not getattr(registry.get(source), "requires_path", True):
            raise ignored_path_error(split, i, source, path)


def check_values(cfg: Mapping[str, Any]) -> None:
    """Raise ConfigError for impossible values (negative sizes, missing paths, bad choices)."""
    for path, choices in _CHOICES.items():
        if _has(cfg, path) and _get(cfg, path) not in choices:
            raise ConfigError(
                f"config.{path}={_get(cfg, path)!r} is not one of {list(choices)}.",
                f"config.{path}",
            )
    for path, minimum in _MIN.items():
        if _has(cfg, path) and _get(cfg, path) < minimum:
            raise ConfigError(
                f"config.{path}={_get(cfg, path)!r} must be >= {minimum}.", f"config.{path}"
            )
    for split in ("TRAIN", "TEST"):
        data = cfg["DATA"][split]
        sources = list(data["DATA_SOURCES"])
        paths = list(data["DATA_PATHS"])
        if paths and len(paths) != len(sources):
            raise ConfigError(
                f"config.DATA.{split}.DATA_PATHS has {len(paths)} entries but DATA_SOURCES has "
                f"{len(sources)}: give one path per data source.",
                f"config.DATA.{split}.DATA_PATHS",
            )
        if not _split_used(cfg, split):
            continue
        _check_ignored_paths(split, sources, paths)
        if not paths and list(data.get("DATASET_NAMES") or []):
            continue  # resolved through the dataset catalog when the data set is built
        for i, source in enumerate(sources):
            if source not in _DISK_SOURCES:
                continue
            if i >= len(paths) or not paths[i]:
                raise ConfigError(
                    f"config.DATA.{split}.DATA_PATHS[{i}] is missing: data source {source!r} "
                    "needs a path (a folder for disk_folder, a .npy file list for disk_filelist).",
                    f"config.DATA.{split}.DATA_PATHS",
                )
            if not os.path.exists(str(paths[i])):
                raise ConfigError(
                    f"config.DATA.{split}.DATA_PATHS[{i}]={paths[i]!r} does not exist.",
                    f"config.DATA.{split}.DATA_PATHS",
                )
        for i, label_path in enumerate(data["LABEL_PATHS"]):
            if label_path and not os.path.exists(str(label_path)):
                raise ConfigError(
                    f"config.DATA.{split}.LABEL_PATHS[{i}]={label_path!r} does not exist.",
                    f"config.DATA.{split}.LABEL_PATHS",
                )
    dist = cfg["DISTRIBUTED"]
    if cfg["TRAINER"]["TASK_NAME"] not in TASK_NAMES:
        raise ConfigError(
            f"config.TRAINER.TASK_NAME={cfg['TRAINER']['TASK_NAME']!r} is not a task: use "
            "'self_supervision_task' (DDP), 'self_supervision_fsdp_task' (FSDP2: the "
            "model, gradients and optimizer state sharded over the processes) or "
            "'self_supervision_sdp_task' (DDP with the optimizer state sharded).",
            "config.TRAINER.TASK_NAME",
        )
    if (
        cfg["CHECKPOINT"]["APPEND_DISTR_RUN_ID"]
        and str(dist["RUN_ID"]) == "auto"
        and cfg["CHECKPOINT"]["AUTO_RESUME"]
    ):
        _warn(
            "config.CHECKPOINT.APPEND_DISTR_RUN_ID with DISTRIBUTED.RUN_ID=auto writes every start "
            "to a new folder, so AUTO_RESUME never finds the previous run; set RUN_ID=host:port."
        )
    if (
        cfg["MODEL"]["ACTIVATION_CHECKPOINTING"]["USE_ACTIVATION_CHECKPOINTING"]
        and int(dist["NUM_NODES"]) * int(dist["NUM_PROC_PER_NODE"]) > 1
        and not dist["MANUAL_GRADIENT_REDUCTION"]
        # FSDP2 reduce-scatters gradients after the recomputed backward itself
        and cfg["TRAINER"]["TASK_NAME"] != "self_supervision_fsdp_task"
    ):
        raise ConfigError(
            "config.MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING with several "
            "processes needs config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION=True (as in VISSL).",
            "config.DISTRIBUTED.MANUAL_GRADIENT_REDUCTION",
        )
    for i, hook in enumerate(cfg["HOOKS"]["CUSTOM_HOOKS"]):
        if not isinstance(hook, Mapping) or not isinstance(hook.get("name"), str):
            raise ConfigError(
                f"config.HOOKS.CUSTOM_HOOKS[{i}] must be a mapping with a 'name' "
                f"(e.g. {{name: my_hook, priority: 50}}), got {hook!r}.",
                f"config.HOOKS.CUSTOM_HOOKS[{i}]",
            )


def _split_used(cfg: Mapping[str, Any], split: str) -> bool:
    if split == "TRAIN":
        return not cfg["TEST_ONLY"]
    return bool(cfg["TEST_MODEL"] or cfg["TEST_ONLY"])


def warn_not_implemented(cfg: Mapping[str, Any]) -> None:
    """Warn for each key of :data:`NOT_IMPLEMENTED` set to other than its inert value."""
    amp_on = bool(((cfg.get("MODEL") or {}).get("AMP_PARAMS") or {}).get("USE_AMP"))
    for path, inert in NOT_IMPLEMENTED.items():
        if path.startswith("MODEL.AMP_PARAMS.") and not amp_on:
            continue  # (AMP is off: its arguments are not used at all)
        if _has(cfg, path) and _get(cfg, path) != inert:
            _warn(
                f"config.{path}={_get(cfg, path)!r}: vissl does not implement this VISSL option "
                f"yet; it runs as if {inert!r}."
            )
    data = cfg.get("DATA") or {}
    machine = cfg.get("MACHINE") or {}
    if (
        machine.get("DEVICE") == "gpu"
        and data.get("ENABLE_ASYNC_GPU_COPY")
        and not data.get("PIN_MEMORY", True)
    ):
        # Batches are always copied with non_blocking=True; that only frees the host
        # from pinned memory.
        _warn(
            "config.DATA.ENABLE_ASYNC_GPU_COPY=True needs config.DATA.PIN_MEMORY=True: "
            "copies from pageable memory block the host."
        )


def fill_registered_defaults(cfg: dict[str, Any]) -> None:
    """Insert keys declared with :func:`register_config_defaults` that ``cfg`` lacks."""
    for path, value in _EXTRA_DEFAULTS.items():
        node = cfg
        parts = path.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        current = node.get(parts[-1])
        if current is None:
            node[parts[-1]] = copy.deepcopy(value)
        elif isinstance(current, dict) and isinstance(value, dict):
            for k, v in value.items():
                current.setdefault(k, copy.deepcopy(v))


def validate_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Upgrade legacy keys, fill plugin defaults, then check keys, types and values."""
    upgrade_legacy_keys(cfg)
    fill_registered_defaults(cfg)
    check_keys(cfg)
    check_types(cfg)
    check_values(cfg)
    warn_not_implemented(cfg)
    return cfg

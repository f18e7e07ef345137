"""Cheap checks of the docs' configs and commands, run as a script in a fresh child process.

    python _checks.py yaml FRAGMENT.yaml
    python _checks.py commands COMMANDS.json

``yaml``: a config fragment (``{config: {...}}``, or a bare ``{DATA: ..., MODEL: ...}``)
laid over ``vissl/config/defaults.yaml`` and validated as a run would validate it (plugins
in ``IMPORTS`` imported), then every registry name it selects is looked up.

``commands``: a JSON list of ``{"cwd": ..., "argv": [...]}``, the ``python``/``torchrun``
commands a docs block would run. A command with a ``config=`` argument is composed with
Hydra and validated with all its overrides, without training; an ``argparse`` script gets
its arguments parsed (it stops at ``parse_args``); any other script must exist.

Paths of data sets that do not exist on this machine (``DATA_PATHS``/``LABEL_PATHS`` of
ImageNet on a cluster) are replaced by an existing folder before validation: the check is
about key names, types and values, not about this machine's disks. Exit status 1 and a
message on stderr on the first failure.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import runpy
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import yaml


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Hydra's merge: mappings merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _existing_paths(config: dict[str, Any], stand_in: str) -> list[str]:
    """Replace data paths that do not exist here by ``stand_in``; return the ones replaced."""
    replaced = []
    for split in ("TRAIN", "TEST"):
        data = (config.get("DATA") or {}).get(split) or {}
        for key in ("DATA_PATHS", "LABEL_PATHS"):
            paths = data.get(key) or []
            for i, path in enumerate(paths):
                if isinstance(path, str) and path and not os.path.exists(path):
                    replaced.append(path)
                    paths[i] = stand_in
    return replaced


def _names(root: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(registry, name, config key) for every registry name the config selects."""
    from vissl.models.base_ssl_model import parse_head_params

    cfg = root["config"]
    yield "engine", str(root.get("engine_name", "train")), "engine_name"
    yield "train step", cfg["TRAINER"]["TRAIN_STEP_NAME"], "config.TRAINER.TRAIN_STEP_NAME"
    yield "loss", cfg["LOSS"]["name"], "config.LOSS.name"
    yield "optimizer", cfg["OPTIMIZER"]["name"], "config.OPTIMIZER.name"
    yield "model", cfg["MODEL"]["BASE_MODEL_NAME"], "config.MODEL.BASE_MODEL_NAME"
    yield "model trunk", cfg["MODEL"]["TRUNK"]["NAME"], "config.MODEL.TRUNK.NAME"
    heads, _ = parse_head_params(cfg["MODEL"]["HEAD"]["PARAMS"])
    for chain in heads:
        for name, _kwargs in chain:
            yield "model head", name, "config.MODEL.HEAD.PARAMS"
    meters = cfg["METERS"].get("names") or []
    for name in [meters] if isinstance(meters, str) else meters:
        yield "meter", name, "config.METERS.names"
    for i, hook in enumerate(cfg["HOOKS"]["CUSTOM_HOOKS"]):
        yield "hook", hook["name"], f"config.HOOKS.CUSTOM_HOOKS[{i}].name"
    for split in ("TRAIN", "TEST"):
        data = cfg["DATA"][split]
        for name in data["DATA_SOURCES"]:
            yield "data source", name, f"config.DATA.{split}.DATA_SOURCES"
        for i, transform in enumerate(data["TRANSFORMS"] or []):
            yield "transform", transform["name"], f"config.DATA.{split}.TRANSFORMS[{i}].name"
        if data.get("COLLATE_FUNCTION"):
            yield "collator", data["COLLATE_FUNCTION"], f"config.DATA.{split}.COLLATE_FUNCTION"
    for group, schedule in (cfg["OPTIMIZER"].get("param_schedulers") or {}).items():
        stack = [schedule]
        while stack:
            node = stack.pop()
            if isinstance(node, Mapping) and "name" in node:
                key = f"config.OPTIMIZER.param_schedulers.{group}"
                yield "param scheduler", node["name"], key
                stack.extend(node.get("schedulers") or [])


def check_names(root: Mapping[str, Any]) -> None:
    """Look every selected name up in its registry (the error names the closest one)."""
    from vissl.utils.registry import get_registry

    for registry_name, name, _key in _names(root):
        registry = get_registry(registry_name)
        if registry is None:
            raise RuntimeError(f"no registry {registry_name!r}: update tests/docs/_checks.py")
        registry.get(name)


def _validate(container: dict[str, Any], stand_in: str) -> None:
    from vissl.utils.hydra_config import convert_to_attrdict

    container.pop("hydra", None)
    if isinstance(container.get("config"), dict):
        replaced = _existing_paths(container["config"], stand_in)
        if replaced:
            print(f"data paths not on this machine, checked as {stand_in}: {replaced}")
    root, _ = convert_to_attrdict(container)
    check_names(root.to_dict())


def check_yaml(path: str) -> None:
    from vissl.config.validation import default_tree

    with open(path, encoding="utf-8") as f:
        fragment = yaml.safe_load(f)
    if "config" in fragment:
        config = fragment["config"]
        root = {k: v for k, v in fragment.items() if k != "config"}
    else:
        config, root = fragment, {}
    _validate({**root, "config": _merge(default_tree(), config)}, os.getcwd())
    print(f"config fragment {path}: valid")


def _script_and_args(argv: list[str]) -> tuple[str | None, list[str]]:
    """The script a ``python``/``torchrun`` command line runs, and its arguments."""
    args = argv[1:]
    if os.path.basename(argv[0]).startswith("torchrun"):
        for i, arg in enumerate(args):
            if arg.endswith(".py"):
                return arg, args[i + 1 :]
        return None, []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in ("-c", "-m"):
            return None, []
        i += 1
    return (args[i], args[i + 1 :]) if i < len(args) else (None, [])


class _ArgsParsed(Exception):
    pass


def _parse_only(script: str, args: list[str]) -> None:
    """Run ``script`` up to its ``ArgumentParser.parse_args`` and stop there."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        original(self, *a, **k)
        raise _ArgsParsed

    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign]
    sys.argv = [script, *args]
    # as `python script.py` does: the script's folder first on the path (its own helpers)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except _ArgsParsed:
        return
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        sys.path.pop(0)
    raise RuntimeError(f"{script} never called ArgumentParser.parse_args")


def check_command(cwd: str, argv: list[str]) -> str:
    from vissl.utils.hydra_config import compose_hydra_configuration

    os.chdir(cwd)
    shown = " ".join(argv)
    if argv[0] in ("python", "python3") and "-c" in argv[1:]:
        code = argv[argv.index("-c") + 1]
        compile(code, "<python -c>", "exec")
        return f"compiles: {shown}"
    script, args = _script_and_args(argv)
    if script is None:
        return f"not checked: {shown}"
    if not os.path.isfile(script):
        raise FileNotFoundError(f"{shown}: no script {script!r} (from {cwd})")
    if any(a.startswith("config=") for a in args):
        from omegaconf import OmegaConf

        overrides = [a for a in args if not a.startswith("-")]
        plain = OmegaConf.to_container(compose_hydra_configuration(overrides), resolve=True)
        if not isinstance(plain, dict):
            raise TypeError(f"{shown}: composed to {type(plain).__name__}, not a mapping")
        _validate({str(k): v for k, v in plain.items()}, cwd)
        return f"config valid: {shown}"
    with open(script, encoding="utf-8") as f:
        if "argparse" not in f.read():
            return f"script exists: {shown}"
    _parse_only(script, args)
    return f"arguments parse: {shown}"


def check_commands(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        commands = json.load(f)
    for command in commands:
        print(check_command(command["cwd"], command["argv"]), flush=True)


def main(argv: list[str]) -> int:
    kind, path = argv
    {"yaml": check_yaml, "commands": check_commands}[kind](path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The method index (vissl/methods.py, #36 item 4): every piece it names exists, every
config it lists composes with those pieces, each self-supervised loss belongs to exactly
one method, and the generated docs table is up to date."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from vissl.errors import UnknownNameError
from vissl.methods import METHODS, SHARED_LOSSES, get_method, method_names
from vissl.utils.imports import import_vissl_plugins
from vissl.utils.registry import get_registry

REPO = Path(__file__).resolve().parents[1]
IDS = [m.name for m in METHODS]


@cache
def _registries() -> dict[str, Any]:
    import_vissl_plugins()
    return {
        kind: get_registry(kind) for kind in ("loss", "model head", "model trunk", "collator")
    } | {"transform": get_registry("transform")}


@cache
def _hook_classes() -> dict[str, type]:
    """Every VisslHook subclass defined in vissl.hooks and vissl.losses, by class name."""
    from vissl.hooks import VisslHook

    found: dict[str, type] = {}
    for package in ("vissl.hooks", "vissl.losses"):
        root = importlib.import_module(package)
        for info in pkgutil.iter_modules(root.__path__):
            module = importlib.import_module(f"{package}.{info.name}")
            for name, obj in inspect.getmembers(module, inspect.isclass):
                if issubclass(obj, VisslHook) and obj.__module__ == module.__name__:
                    found[name] = obj
    return found


def test_names_are_unique_and_looked_up() -> None:
    assert len(set(IDS)) == len(IDS)
    assert method_names() == IDS
    assert get_method("dino").loss == ("dino_loss",)
    with pytest.raises(UnknownNameError, match="dinov3.*known: .*'dino'"):
        get_method("dinov3")


@pytest.mark.parametrize("name", IDS)
def test_every_piece_resolves(name: str) -> None:
    spec = get_method(name)
    reg = _registries()
    for loss in spec.loss:
        assert loss in reg["loss"], (name, loss)
    for head in spec.heads:
        assert head in reg["model head"], (name, head)
    for trunk in spec.trunks:
        assert trunk in reg["model trunk"], (name, trunk)
    if spec.collator is not None:
        assert spec.collator in reg["collator"], (name, spec.collator)
    for transform in spec.transforms:
        assert transform in reg["transform"], (name, transform)
    missing = [h for h in spec.hooks if h not in _hook_classes()]
    assert not missing, f"{name}: no hook class {missing}"
    assert (REPO / "docs" / spec.docs).is_file(), spec.docs
    for config in spec.configs.all():
        assert (REPO / "configs" / "config" / f"{config}.yaml").is_file(), config
    assert spec.configs.quick or spec.configs.digits, f"{name} has no CPU config"


def test_every_self_supervised_loss_belongs_to_exactly_one_method() -> None:
    owners: dict[str, list[str]] = {}
    for spec in METHODS:
        for loss in spec.loss:
            owners.setdefault(loss, []).append(spec.name)
    own = set(_registries()["loss"].names()) - SHARED_LOSSES
    registered_by_vissl = {
        n for n in own if _registries()["loss"].get(n).__module__.startswith("vissl.")
    }
    assert registered_by_vissl - owners.keys() == set(), "losses no method names"
    shared = {loss: m for loss, m in owners.items() if len(m) > 1 and loss not in SHARED_LOSSES}
    # NPID and PIRL are one loss (VISSL's nce_loss_with_memory) with two inputs.
    assert shared == {"nce_loss_with_memory": ["npid", "pirl"]}


def _composed(config: str) -> Any:
    from vissl.utils.hydra_config import hydra_compose_and_validate

    _, cfg = hydra_compose_and_validate([f"config={config}"])
    return cfg


def _head_names(entry: Any) -> list[str]:
    """``[name, params]``, or a list of them (PIRL's head per input)."""
    if isinstance(entry[0], str):
        return [entry[0]]
    return [name for sub in entry for name in _head_names(sub)]


def _check_config_pieces(spec: Any, config: str) -> None:
    cfg = _composed(config)
    assert cfg.LOSS.name in spec.loss, (config, cfg.LOSS.name)
    assert cfg.MODEL.TRUNK.NAME in spec.trunks, (config, cfg.MODEL.TRUNK.NAME)
    heads = [name for entry in cfg.MODEL.HEAD.PARAMS for name in _head_names(entry)]
    assert all(h in spec.heads for h in heads), (config, heads)
    if spec.collator is not None:
        assert cfg.DATA.TRAIN.COLLATE_FUNCTION == spec.collator, config


@pytest.mark.parametrize("name", [m.name for m in METHODS if m.configs.quick])
def test_the_quick_config_composes_with_the_named_pieces(name: str) -> None:
    spec = get_method(name)
    _check_config_pieces(spec, spec.configs.quick[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", IDS)
def test_every_cpu_config_composes_with_the_named_pieces(name: str) -> None:
    spec = get_method(name)
    for config in (*spec.configs.quick, *spec.configs.digits):
        if "clusterfit" in config:
            continue  # the features config has no loss; the training one needs its labels
        _check_config_pieces(spec, config)


@pytest.mark.slow
@pytest.mark.parametrize("name", [m.name for m in METHODS if m.configs.quick])
def test_the_loss_asks_for_the_named_hooks_and_holds_the_named_copy(
    name: str, tmp_path: Path
) -> None:
    """Build the task of every quick config (no training) and read what its loss asks for."""
    import torch

    from vissl.trainer.task import SelfSupervisionTask

    spec = get_method(name)
    asked: set[str] = set()
    copies: set[str] = set()
    for config in spec.configs.quick:
        cfg = _composed(config)
        task = SelfSupervisionTask(cfg, str(tmp_path), torch.device("cpu"), ()).build()
        loss = task.loss
        asked |= {type(h).__name__ for h in (getattr(loss, "required_hooks", list)() or [])}
        copies |= {
            a
            for a in ("teacher", "momentum_encoder", "target_network", "target_encoder")
            if isinstance(getattr(loss, a, None), torch.nn.Module)
        }
    assert asked <= set(spec.hooks), (name, asked)
    if spec.teacher is None:
        assert not copies, (name, copies)
    else:
        assert spec.teacher in copies, (name, copies)


def test_the_docs_table_is_generated_from_the_index() -> None:
    path = REPO / "extra_scripts" / "generate_methods_table.py"
    module_spec = importlib.util.spec_from_file_location("generate_methods_table", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    current, fresh = module.updated()
    assert current == fresh, "run python extra_scripts/generate_methods_table.py"
    for spec in METHODS:
        assert f"[{spec.title}]" in current

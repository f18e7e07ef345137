"""The data package's modules import each other in one direction only.

Two circles used to exist here:

- ``vissl.data.ssl_dataset`` <-> ``vissl.data.ssl_transforms.device_path`` (the device path
  borrowed ``seeded_rng`` from the dataset; it now lives in ``ssl_transforms.seeding``);
- ``vissl.data.ssl_transforms.ssl_transforms_wrapper`` <-> ``...tensor_path`` (the tensor
  path built wrappers from the module that plans it; the wrappers now live in
  ``ssl_transforms.sample_wrapper``, the registry in ``ssl_transforms.registry``).

The graph is read from the source with ``ast``, every import counted: at module level,
inside functions and under ``if TYPE_CHECKING`` (a lazy import that only dodges a circle is
still a circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vissl" / "data"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def imports_of(source: str, mods: set[str], package: str = "") -> set[str]:
    """The modules of ``mods`` that ``source`` imports, anywhere in the file."""

    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    deps: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            deps.update(resolve(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package upwards
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                deps.add(resolve(full) if full in mods else resolve(base))
    deps.discard("")
    return deps


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = imports_of(path.read_text(encoding="utf-8"), set(mods), package)
        deps.discard(name)
        graph[name] = deps
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("vissl.data.ssl_dataset", "vissl.data.ssl_transforms.device_path"),
        (
            "vissl.data.ssl_transforms.ssl_transforms_wrapper",
            "vissl.data.ssl_transforms.tensor_path",
        ),
    ],
    ids=["dataset-device_path", "wrapper-tensor_path"],
)
def test_the_two_circles_are_gone(a, b):
    graph = import_graph()
    assert a in graph and b in graph
    assert not (b in reachable(graph, a) and a in reachable(graph, b)), f"{a} <-> {b}"


def test_the_data_package_has_no_import_circle():
    graph = import_graph()
    circles = sorted(
        sorted(mod for mod in graph if start in reachable(graph, mod) and mod != start)
        for start in graph
        if start in reachable(graph, start)
    )
    assert not circles, f"modules importing themselves through others: {circles}"


def test_the_transforms_sit_below_the_dataset_and_the_decode_path():
    graph = import_graph()
    above = {"vissl.data.ssl_dataset", "vissl.data.device_decode", "vissl.data"}
    for mod, deps in graph.items():
        if mod.startswith("vissl.data.ssl_transforms"):
            assert not (deps & above), (mod, deps & above)
    # the registry, the sample wrappers and the seeding import no other transform module
    for low in ("registry", "sample_wrapper", "seeding"):
        deps = graph[f"vissl.data.ssl_transforms.{low}"]
        assert not {d for d in deps if d.startswith("vissl.data.ssl_transforms.")} - {
            "vissl.data.ssl_transforms.registry"
        }, (low, deps)


def test_lazy_and_type_checking_imports_count():
    mods = {"vissl.data.a", "vissl.data.b", "vissl.data.c", "vissl.data"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from vissl.data.b import X\n"
        "def f():\n    import vissl.data.c\n"
        "    from . import a\n"
    )
    assert imports_of(source, mods, "vissl.data") == {
        "vissl.data.a",
        "vissl.data.b",
        "vissl.data.c",
    }


def test_names_stay_importable_where_they_were():
    import vissl.data.ssl_transforms as package
    from vissl.data import ssl_dataset
    from vissl.data.ssl_transforms import registry, sample_wrapper, seeding, tensor_path
    from vissl.data.ssl_transforms import ssl_transforms_wrapper as wrapper

    assert ssl_dataset.seeded_rng is seeding.seeded_rng
    for name in ("SSLTransformsWrapper", "SSLTransformsCompose"):
        assert getattr(package, name) is getattr(wrapper, name) is getattr(sample_wrapper, name)
    for name in ("KINDS", "TENSOR_PATH_START", "transform_kind"):
        assert getattr(wrapper, name) is getattr(sample_wrapper, name)
    assert package.build_transforms is wrapper.build_transforms
    for name in ("TRANSFORM_REGISTRY", "get_transform", "register_transform"):
        assert getattr(package, name) is getattr(registry, name)
    assert tensor_path.TENSOR_PATH_START == "ToImageTensor" and callable(
        tensor_path.plan_tensor_path
    )

"""vissl's modules import each other without circles (#22): dependencies point down
(tools -> engines -> trainer -> hooks/models/losses/data -> config -> utils).

The graph is read from the source with ``ast``: every import counts, also those inside
functions and under ``if TYPE_CHECKING`` (a lazy import that only dodges a circle is
still a circle). The one pattern allowed is a registry package whose ``__init__`` imports
its ``build`` module at the end while ``build`` reads the package's registry.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: registry packages and the modules they import back (see the module docstring)
ALLOWED = [
    {"vissl.optimizers", "vissl.optimizers.build"},
    {
        "vissl.optimizers.param_scheduler",
        "vissl.optimizers.param_scheduler.scheduler_set",
        "vissl.optimizers.param_scheduler.schedulers",
    },
    {"vissl.models", "vissl.models.base_ssl_model"},
    {"vissl.meters", "vissl.meters.build"},
    {"vissl.losses", "vissl.losses.build"},
]


def _modules() -> dict[str, Path]:
    mods = {}
    for path in (ROOT / "vissl").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def import_graph() -> dict[str, set[str]]:
    mods = _modules()

    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps.update(resolve(a.name) for a in node.names if a.name.startswith("vissl"))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.startswith("vissl"):
                    for a in node.names:
                        full = f"{node.module}.{a.name}"
                        deps.add(resolve(full) if full in mods else resolve(node.module))
        deps.discard(mod)
        deps.discard("")
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_no_import_circles() -> None:
    circles = [c for c in cycles(import_graph()) if c not in ALLOWED]
    assert not circles, "import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in circles)


def test_the_circles_named_in_issue_22_are_gone() -> None:
    graph = import_graph()
    for a, b in [
        ("vissl.hooks.base", "vissl.trainer.task"),
        ("vissl.trainer.task", "vissl.trainer.checkpointing"),
        ("vissl.losses.dino_loss", "vissl.hooks.dino_hooks"),
    ]:
        assert not (a in graph[b] and b in graph[a]), f"{a} <-> {b}"
    # hooks sit below the trainer: no hook imports it at run time
    for mod, deps in graph.items():
        if mod.startswith("vissl.hooks"):
            runtime = {d for d in deps if d.startswith("vissl.trainer")}
            assert runtime <= {"vissl.trainer.task"}, (mod, runtime)  # type hints only

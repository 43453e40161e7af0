"""The import graph stays acyclic: between engine's subpackages, between grammar's modules, and
nothing imports another module's private names.

Read from the source with ``ast`` (nothing is imported): every ``import`` counts, at module level
or inside a function, except those under ``if TYPE_CHECKING:`` (annotations only). A cycle is
reported with its edges and the files that make them, so a failure says which import to move.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from grammar.rule_graph import strongly_connected_components

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "grammar", "formcast_kernels")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for each run-time import of one module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.orelse:
                    visit(stmt)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, []) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    module = ".".join(base + ([child.module] if child.module else []))
                else:
                    module = child.module or ""
                for alias in child.names:
                    sub = f"{module}.{alias.name}"
                    found.append((sub, []) if sub in modules else (module, [alias.name]))
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return [(m, names) for m, names in found if m in modules]


def _node(module: str) -> str:
    """engine: one node per subpackage (or top-level module); grammar and formcast_kernels: per module."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "engine" else module


def _graph(modules: dict[str, Path], root: Path = REPO) -> dict[str, dict[str, list[str]]]:
    """node -> imported node -> the files whose imports make that edge."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, path in modules.items():
        for target, _ in _imports(name, path, modules):
            a, b = _node(name), _node(target)
            if a != b:
                graph[a][b].append(str(path.relative_to(root)))
    return graph


def _cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components with more than one node."""
    refs = {node: frozenset(targets) for node, targets in graph.items()}
    return [sorted(c) for c in strongly_connected_components(refs) if len(c) > 1]


def _describe(graph: dict[str, dict[str, list[str]]], component: list[str]) -> str:
    edges = [f"  {a} -> {b} ({', '.join(sorted(set(graph[a][b])))})" for a in component for b in component if b in graph.get(a, {})]
    return "\n".join([" <-> ".join(component), *edges])


def test_no_import_cycles_between_engine_subpackages_or_grammar_modules() -> None:
    graph = _graph(MODULES)
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(_describe(graph, c) for c in cycles)


def test_no_module_imports_another_modules_private_names() -> None:
    offenders = [
        f"{path.relative_to(REPO)}: {name} from {target}"
        for module, path in MODULES.items()
        for target, names in _imports(module, path, MODULES)
        for name in names
        if name.startswith("_") and not name.startswith("__") and target != module
    ]
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "cycle",
    [
        {"engine/managers/a.py": "from ..speculative import b\n", "engine/speculative/b.py": "from ..managers.a import x\n"},
        {"grammar/a.py": "def f():\n    from .b import g\n", "grammar/b.py": "from .a import f\n"},
    ],
)
def test_the_cycle_finder_sees_a_cycle(cycle: dict[str, str], tmp_path: Path) -> None:
    """The checks above cannot pass vacuously: a planted two-module cycle (one of them through a
    function-level import) is found, and once one side is type-only it is not."""
    modules = {}
    for rel, text in cycle.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
        modules[".".join(Path(rel).with_suffix("").parts)] = tmp_path / rel
    assert len(_cycles(_graph(modules, tmp_path))) == 1
    first = next(iter(cycle))
    typed = "".join(f"    {line}\n" for line in cycle[first].splitlines())
    (tmp_path / first).write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n" + typed)
    assert _cycles(_graph(modules, tmp_path)) == []

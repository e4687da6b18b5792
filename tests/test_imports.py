"""No import cycles in src/aserve.

The graph has an edge for every import statement of a module of the package, at module
level or inside a function (an import moved into a function to dodge a cycle still
counts), except those under `if TYPE_CHECKING:`, which never run. A module's implicit
import of its parent packages is no edge.
"""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
PACKAGE = "aserve"

def modules() -> dict[str, pathlib.Path]:
    """Every module of the package, by dotted name (a package by its own name); an
    extension module by its stub (`_native.pyi`), as a module that imports nothing."""
    out = {}
    for path in sorted([*(SRC / PACKAGE).rglob("*.py"), *(SRC / PACKAGE).rglob("*.pyi")]):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.setdefault(".".join(parts), path)
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that can run: all but those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def graph() -> dict[str, set[str]]:
    """module -> the modules of the package it imports."""
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        if path.suffix == ".pyi":
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from package import module` imports the module; `from module import name`, the module
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]
            for target in targets:
                while target and target not in known:  # `import aserve.x.y` of a name, not a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(tuple(sorted(component)))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_the_graph_sees_imports_inside_functions_and_skips_type_checking() -> None:
    edges = graph()
    assert "aserve.engine" in edges["aserve.cli"]  # imported inside a function
    assert "aserve.tensor" in edges["aserve.batching.batcher"]
    assert "aserve.engine" not in edges["aserve"]  # only under TYPE_CHECKING
    assert "aserve._native" in edges["aserve.engine.tunables"]  # `from .. import _native`: the extension


def test_no_import_cycle_in_the_package() -> None:
    found = cycles(graph())
    assert found == set(), "import cycles (modules of each): " + "; ".join(" <-> ".join(c) for c in sorted(found))

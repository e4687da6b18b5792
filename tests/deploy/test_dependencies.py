"""pyproject.toml's [project] dependencies are exactly what the installed server imports.

A module of src/aserve may import, when it is imported, only the standard library, aserve
and the declared dependencies; every declared dependency is imported somewhere in
src/aserve. Imports inside functions or guarded by `except ImportError` are optional (torch
in model interpreters, OpenTelemetry from the otel extra) and are not counted against it.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import pathlib
import re
import sys
import tomllib
from collections.abc import Mapping

from ..conftest import ROOT

SRC = ROOT / "src" / "aserve"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = set()
    for requirement in project["dependencies"]:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match, requirement
        out.add(_normal(match.group()))
    return out


def declared_extras() -> set[str]:
    """The distributions the extras ([project.optional-dependencies]) name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = set()
    for requirements in project.get("optional-dependencies", {}).values():
        for requirement in requirements:
            match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
            assert match, requirement
            out.add(_normal(match.group()))
    return out


def _guarded(handlers: list[ast.ExceptHandler]) -> bool:
    names = {n.id for h in handlers for n in ast.walk(h.type) if isinstance(n, ast.Name)} if handlers else set()
    return bool(names & {"ImportError", "ModuleNotFoundError"})


def imports(tree: ast.Module, *, at_import_only: bool) -> set[str]:
    """Top-level names of the absolute imports in `tree`; with `at_import_only`, only those the
    module body runs unconditionally (not in functions, not under `except ImportError`)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if at_import_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if at_import_only and isinstance(node, ast.Try) and _guarded(node.handlers):
            return
        if at_import_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@functools.cache
def _installed() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions(module: str) -> set[str]:
    """The distributions that install top-level module `module` (by normalised name)."""
    return {_normal(d) for d in _installed().get(module, [module])}


def _aserve_imports(path: pathlib.Path, tree: ast.Module, *, at_import_only: bool) -> set[pathlib.Path]:
    """The files of aserve that `path` imports (relative or absolute imports of aserve modules)."""
    found: set[pathlib.Path] = set()

    def visit(node: ast.AST) -> None:
        if at_import_only and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if at_import_only and isinstance(node, ast.Try) and _guarded(node.handlers):
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
            elif node.module and node.module.split(".")[0] == "aserve":
                base = SRC.parent
            else:
                base = None
            if base is not None:
                parts = (node.module or "").split(".") if node.module else []
                target = base.joinpath(*parts)
                for alias in node.names:  # `from . import otel` names a module
                    found.add(target / f"{alias.name}.py")
                found.add(target.with_suffix(".py"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def optional_modules() -> set[pathlib.Path]:
    """Modules of aserve that are only ever imported inside functions or under `except
    ImportError` (those of an extra, such as the OpenTelemetry SDK's bridge in model
    interpreters): they may import what only their extra installs."""
    eager: set[pathlib.Path] = set()
    lazy: set[pathlib.Path] = set()
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        now = _aserve_imports(path, tree, at_import_only=True)
        eager |= now
        lazy |= _aserve_imports(path, tree, at_import_only=False) - now
    return {p for p in lazy - eager if p.exists()}


def test_the_server_imports_only_the_standard_library_and_its_dependencies() -> None:
    allowed = declared()
    wrong = {}
    optional = optional_modules()
    assert SRC / "runtime" / "otel.py" in optional
    extras = allowed | declared_extras()
    for path in sorted(SRC.rglob("*.py")):
        if path in optional:  # checked against the extras too
            for module in imports(ast.parse(path.read_text()), at_import_only=True):
                if module not in sys.stdlib_module_names and module not in ("aserve", "__future__") \
                        and not distributions(module) & extras:
                    wrong[str(path.relative_to(ROOT))] = module
            continue
        for module in imports(ast.parse(path.read_text()), at_import_only=True):
            if module in sys.stdlib_module_names or module in ("aserve", "__future__"):
                continue
            if not distributions(module) & allowed:
                wrong[str(path.relative_to(ROOT))] = module
    assert not wrong, f"imported when the module is, but not in [project] dependencies: {wrong}"


def test_every_dependency_is_imported_by_the_server() -> None:
    used: set[str] = set()
    for path in SRC.rglob("*.py"):
        for module in imports(ast.parse(path.read_text()), at_import_only=False):
            used |= distributions(module)
    unused = declared() - used
    assert not unused, f"[project] dependencies that src/aserve never imports (move them to an extra): {unused}"

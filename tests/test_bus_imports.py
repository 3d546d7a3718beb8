"""The package's shape (issues 11, 29): no import circle anywhere in it, no oversized module.

Imports are read with :mod:`ast`, not by importing: an import under
``if TYPE_CHECKING:`` or inside a function is a dependency as much as one at the top
(a circle hidden behind ``TYPE_CHECKING`` is still a circle in the design).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trainbus

PACKAGE_DIR = Path(trainbus.__file__).parent
MAX_LINES = 600  # advisory: a module past it probably holds two concepts


def module_names(package_dir: Path, package: str) -> dict[str, Path]:
    """Every module of the package under ``package_dir``, by dotted name."""
    modules: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join([package, *parts])] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that the module ``name`` imports, wherever the import is."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):  # top level, TYPE_CHECKING blocks, functions, classes
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            # ``from pkg import mod`` imports the submodule; ``from pkg import name`` pkg.
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # ``import pkg.mod.attr`` -> pkg.mod
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(package_dir: Path, package: str) -> dict[str, set[str]]:
    """Module name to the modules of the same package it imports."""
    modules = module_names(package_dir, package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or ``None`` if there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_no_module_of_trainbus_takes_part_in_an_import_circle() -> None:
    graph = import_graph(PACKAGE_DIR, "trainbus")
    assert "trainbus.bus" in graph and len(graph) > 20, sorted(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_no_module_of_trainbus_is_over_600_lines() -> None:
    sizes = {
        f"src/{path.relative_to(PACKAGE_DIR.parent).as_posix()}": len(
            path.read_text("utf-8").splitlines()
        )
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
    }
    offenders = {path: n for path, n in sizes.items() if n > MAX_LINES}
    assert not offenders, f"modules over {MAX_LINES} lines: " + ", ".join(
        f"{path} ({n})" for path, n in sorted(offenders.items(), key=lambda kv: -kv[1])
    )


# -- the checker itself finds what it must ------------------------------------------------


TYPE_CHECKING_BLOCK = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"


def write_package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return pkg


@pytest.mark.parametrize(
    "files",
    [
        {  # hidden behind TYPE_CHECKING
            "__init__.py": "",
            "a.py": "from pkg.b import B\n",
            "b.py": TYPE_CHECKING_BLOCK + "    from pkg.a import A\n",
        },
        {  # a function-level import, relative
            "__init__.py": "",
            "a.py": "from . import b\n",
            "b.py": "def f():\n    from .c import C\n",
            "c.py": "import pkg.a\n",
        },
        {  # through the package's __init__, and a subpackage
            "__init__.py": "from pkg.sub.x import X\n",
            "sub/__init__.py": "",
            "sub/x.py": "from ..y import Y\n",
            "y.py": "from pkg import X\n",
        },
    ],
    ids=["type-checking", "function-level", "init-and-subpackage"],
)
def test_the_checker_finds_hidden_circles(tmp_path: Path, files: dict[str, str]) -> None:
    graph = import_graph(write_package(tmp_path, files), "pkg")
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1] and len(cycle) >= 3, graph


def test_the_checker_accepts_a_layered_package(tmp_path: Path) -> None:
    files = {
        "__init__.py": "from pkg.top import Top\n",
        "top.py": "from pkg import low\nfrom pkg.mid import M\nimport anyio\n",
        "mid.py": TYPE_CHECKING_BLOCK + "    from pkg.low import L\n",
        "low.py": "import threading\n",
    }
    graph = import_graph(write_package(tmp_path, files), "pkg")
    assert graph == {
        "pkg": {"pkg.top"},
        "pkg.top": {"pkg.low", "pkg.mid"},
        "pkg.mid": {"pkg.low"},
        "pkg.low": set(),
    }
    assert find_cycle(graph) is None

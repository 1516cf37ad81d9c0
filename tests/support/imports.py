"""Which modules a Python file imports, read from its syntax tree (never by importing it): the tests
of layering, of the bench's layers and of its tree check them."""

from __future__ import annotations

import ast
from pathlib import Path


def bench_imports(path: Path) -> set[str]:
    """The bench modules the file at `path` imports, by their names in bench/."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "bench":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("bench."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("bench.")}
    return found


def imported_modules(path: Path) -> set[str]:
    """Every module the file at `path` imports, by its dotted name; for `from a.b import c`, both a.b and
    a.b.c (c may be a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found

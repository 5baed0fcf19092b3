"""Count what docs/architecture.md counts: driver loops, private names and private modules
reached across packages, and the modules that stay whole past the size limit.

Run ``python -m tests.architecture_counts`` from the repository's root to print them;
``tests/test_architecture.py`` checks the page's table against the same functions.

- A **driver loop** is a function that runs a statement generator: it calls ``next(op)``
  and ``op.send(…)`` on the same name.
- A **private name crossing packages** is an underscore name imported from another
  subpackage of ``sa_outbox`` (``from ..queue._executors import _JobOps``): one per name
  per importing module.
- An **import into another package's private module** is a ``from … import`` whose module
  is another subpackage's underscore module (``from ..statements._common import …``).
- A module **over the size limit** has more than `MAX_LINES` lines; its docstring must say
  why it stays whole (`WHOLE_MARK`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sa_outbox"
#: A module longer than this says in its docstring why it stays whole.
MAX_LINES = 600
#: The words that start that sentence.
WHOLE_MARK = "It stays whole because"


def module_paths() -> list[str]:
    """Every module of the package, as a path from the repository's root
    (``sa_outbox/worker/_core.py``); the ``__init__.py`` of each subpackage is left out
    (the page names the subpackage, ``sa_outbox/worker/``)."""
    return sorted(
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "__pycache__" not in path.parts
        and not (path.name == "__init__.py" and path.parent != PACKAGE)
    )


def _trees() -> Iterator[tuple[str, list[str], ast.Module]]:
    """(path, dotted module parts, parsed tree) of every module, ``__init__`` included."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        yield path.relative_to(ROOT).as_posix(), parts, ast.parse(path.read_text())


def _subpackage(parts: list[str]) -> str | None:
    """The subpackage of ``sa_outbox`` a dotted module is in (None: a root module)."""
    if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()):
        return parts[1]
    return None


def _imports(parts: list[str], tree: ast.Module) -> Iterator[tuple[list[str], ast.ImportFrom]]:
    """Each ``from … import`` of the package's own modules, with its module's dotted parts."""
    package = parts[:-1]  # a module's package; ``__init__``'s is its own folder
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - (node.level - 1)]
            yield base + (node.module.split(".") if node.module else []), node
        elif node.module and node.module.split(".")[0] == "sa_outbox":
            yield node.module.split("."), node


def private_names_crossing() -> list[tuple[str, str, str]]:
    """(importing module's path, imported module, name) for each underscore name imported
    from another subpackage."""
    found = []
    for path, parts, tree in _trees():
        here = _subpackage(parts)
        for module, node in _imports(parts, tree):
            there = _subpackage(module)
            if there is None or there == here:
                continue
            found += [
                (path, ".".join(module), alias.name)
                for alias in node.names
                if alias.name.startswith("_")
            ]
    return found


def private_module_imports() -> list[tuple[str, str]]:
    """(importing module's path, imported module) for each import from another
    subpackage's private module."""
    found = []
    for path, parts, tree in _trees():
        here = _subpackage(parts)
        for module, _node in _imports(parts, tree):
            there = _subpackage(module)
            if there is None or there == here:
                continue
            if any(part.startswith("_") for part in module[2:]):
                found.append((path, ".".join(module)))
    return found


def driver_loops() -> list[tuple[str, str]]:
    """(path, function) for each function that calls ``next(op)`` and ``op.send(…)`` on
    one name: a loop driving a statement generator."""
    found = []
    for path, _parts, tree in _trees():
        for scope in ast.walk(tree):
            if not isinstance(scope, ast.ClassDef | ast.Module):
                continue
            prefix = f"{scope.name}." if isinstance(scope, ast.ClassDef) else ""
            for function in scope.body:
                if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                started, sent = set(), set()
                for node in ast.walk(function):
                    if not isinstance(node, ast.Call):
                        continue
                    func = node.func
                    if isinstance(func, ast.Name) and func.id == "next" and node.args:
                        if isinstance(node.args[0], ast.Name):
                            started.add(node.args[0].id)
                    elif (
                        isinstance(func, ast.Attribute)
                        and func.attr == "send"
                        and isinstance(func.value, ast.Name)
                    ):
                        sent.add(func.value.id)
                if started & sent:
                    found.append((path, prefix + function.name))
    return found


def long_modules() -> list[tuple[str, int, bool]]:
    """(path, lines, whether its docstring says why it stays whole) for each module over
    `MAX_LINES` lines."""
    found = []
    for path, _parts, tree in _trees():
        lines = len((ROOT / path).read_text().splitlines())
        if lines > MAX_LINES:
            found.append((path, lines, WHOLE_MARK in (ast.get_docstring(tree) or "")))
    return found


def counts() -> dict[str, int]:
    """The numbers of docs/architecture.md's table, by the name of their row."""
    return {
        "driver loops": len(driver_loops()),
        "private names crossing packages": len(private_names_crossing()),
        "imports into another package's private module": len(private_module_imports()),
    }


def main() -> None:
    for path, function in driver_loops():
        print(f"driver loop: {path} {function}")
    for path, module, name in private_names_crossing():
        print(f"private name crossing packages: {path} imports {module}.{name}")
    for path, lines, says in long_modules():
        print(f"over {MAX_LINES} lines: {path} ({lines}){'' if says else ' — no reason given'}")
    for row, number in counts().items():
        print(f"{row}: {number}")


if __name__ == "__main__":
    main()

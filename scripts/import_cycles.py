"""List the import cycles among shardex's modules (tests/test_layers.py wants none).

    python scripts/import_cycles.py          # module-level imports (what runs at import time)
    python scripts/import_cycles.py --all    # every dependency: also imports inside
                                             # functions and under ``if TYPE_CHECKING:``

Reads the sources under src/shardex with ``ast``. Without ``--all``, imports under ``if
TYPE_CHECKING:`` (they never run) and inside functions are left out: a cycle that only
they close still ties the modules together, so the test counts them. ``from shardex.a import b`` counts as importing ``shardex.a.b`` when
that is a module, else ``shardex.a``. Prints each strongly connected group of modules with
one cycle through it, and exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "shardex").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(body: list[ast.stmt], lazy: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            # what type checkers read is a dependency too (--all); at import time, never runs
            yield from _import_nodes(node.body if lazy else [], lazy)
            yield from _import_nodes(node.orelse, lazy)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if lazy:
                yield from _import_nodes(node.body, lazy)
        else:  # if/try/with/class bodies run at import time (functions inside them do not)
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from _import_nodes(inner, lazy)
            for handler in getattr(node, "handlers", []):
                yield from _import_nodes(handler.body, lazy)


def _targets(name: str, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level - 1 more
        package = name.split(".") if known[name].name == "__init__.py" else name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    out = set()
    for alias in node.names:
        child = f"{base}.{alias.name}"
        if child in known:
            out.add(child)
        elif base in known:
            out.add(base)
    return out


def _graph(lazy: bool) -> dict[str, set[str]]:
    known = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        edges = set()
        for node in _import_nodes(tree.body, lazy):
            edges |= _targets(name, node, known)
        graph[name] = edges - {name}
    return graph


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, those with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _one_cycle(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A shortest cycle through the group's first module (breadth first)."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    return group


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--all",
        action="store_true",
        help="count imports inside functions and under TYPE_CHECKING too",
    )
    args = parser.parse_args()
    graph = _graph(lazy=args.all)
    groups = _components(graph)
    what = "all imports" if args.all else "module-level imports"
    print(f"{len(graph)} modules, {len(groups)} import cycle group(s) ({what})")
    for group in groups:
        print(f"- {len(group)} modules: {' -> '.join(_one_cycle(graph, group))}")
        if len(group) > 2:
            print(f"  all: {', '.join(group)}")
    return 1 if groups else 0


if __name__ == "__main__":
    sys.exit(main())

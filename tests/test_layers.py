"""The layers hold: ``format/`` is leaf codecs, only the registry knows backends by name
(the rest of the code asks a backend's declared capabilities and methods), and no module
imports another that imports it back."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import shardex
from shardex.backends.registry import REGISTRY

SRC = Path(shardex.__file__).parent
BUILTIN_NAMES = frozenset(e.name for e in REGISTRY.entries() if e.origin == "built-in")


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_format_modules_import_nothing_of_shardex_but_errors() -> None:
    bad = {
        f"{path.name}: {module}"
        for path in sorted((SRC / "format").glob("*.py"))
        for module in _imports(path)
        if module.startswith("shardex")
        and module != "shardex.errors"
        and not module.startswith("shardex.format.")
    }
    assert not bad, sorted(bad)


def test_storage_imports_nothing_above_it() -> None:
    """Storage (and its byte fetchers, ``storage/fetch/``) sits under the sources, the
    engine and the backends: data flows down to it, never back up."""
    bad = {
        f"{path.relative_to(SRC).as_posix()}: {module}"
        for path in sorted((SRC / "storage").rglob("*.py"))
        for module in _imports(path)
        if module.split(".")[:2]
        in (["shardex", "sources"], ["shardex", "engine"], ["shardex", "backends"])
    }
    assert not bad, sorted(bad)


def _name_comparisons(path: Path) -> Iterator[str]:
    """Built-in backend names compared against (``== "webdataset"``, ``in ("torch", ...)``)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare):
            continue
        for operand in (node.left, *node.comparators):
            values = (
                operand.elts if isinstance(operand, (ast.Tuple, ast.Set, ast.List)) else [operand]
            )
            for value in values:
                if isinstance(value, ast.Constant) and value.value in BUILTIN_NAMES:
                    yield str(value.value)


def test_no_module_but_the_registry_branches_on_a_backend_name() -> None:
    """Not the engine, the loaders, the other backends, nor the conformance suite that
    plugin authors run."""
    assert {"webdataset", "numpy", "zarr"} <= BUILTIN_NAMES
    found = {
        (path.relative_to(SRC).as_posix(), name)
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).as_posix() != "backends/registry.py"
        for name in _name_comparisons(path)
    }
    assert not found, sorted(found)


def _named_backends() -> set[str]:
    """The modules of built-in backends: every module under ``backends/`` but the
    interface, the registry and what they share."""
    shared = {"__init__", "base", "registry", "ownership", "metadata", "columns"}
    return {
        p.relative_to(SRC.parent).with_suffix("").as_posix().replace("/", ".")
        for p in (SRC / "backends").rglob("*.py")
        if p.stem not in shared or p.parent.name == "webdataset"
    }


def test_the_engine_calls_the_backends_never_the_reverse() -> None:
    """``backends/`` imports nothing from ``engine/`` (a backend supplies parts the engine
    calls), and ``engine/`` imports no named backend (it knows them by their interface)."""
    up = {
        f"{path.relative_to(SRC)}: {module}"
        for path in sorted((SRC / "backends").rglob("*.py"))
        for module in _imports(path)
        if module.startswith("shardex.engine")
    }
    assert not up, sorted(up)
    named = _named_backends()
    assert "shardex.backends.webdataset.writer" in named
    assert "shardex.backends.arrays" in named
    down = {
        f"{path.relative_to(SRC)}: {module}"
        for path in sorted((SRC / "engine").rglob("*.py"))
        for module in _imports(path)
        if module in named or any(module.startswith(n + ".") for n in named)
    }
    assert not down, sorted(down)


def test_no_import_cycle_among_shardex_modules() -> None:
    """Counting every import: inside functions and under ``TYPE_CHECKING`` too."""
    script = Path(__file__).parents[1] / "scripts" / "import_cycles.py"
    out = subprocess.run(
        [sys.executable, str(script), "--all"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout
    assert " 0 import cycle group" in out.stdout


def test_the_wheel_ships_no_test_harness() -> None:
    """``shardex.testing`` holds what third parties use (the conformance suites, test data,
    the docs' example model); the S3 server runner, the counting proxy, the Ray cluster, the
    test stages and the interop readers live under ``tests/support`` and no shipped module
    imports them."""
    shipped = {p.stem for p in (SRC / "testing").glob("*.py")}
    assert shipped == {"__init__", "backend", "data", "models", "storage"}
    harness = {
        f"{path.relative_to(SRC)}: {module}"
        for path in sorted(SRC.rglob("*.py"))
        for module in _imports(path)
        if module.split(".")[0] in ("tests", "support", "webdataset")
    }
    assert not harness, sorted(harness)


def test_pipeline_plumbing_stays_out_of_the_public_export() -> None:
    """``runner``, ``pipeline``, ``spec_fingerprint`` and ``lock`` are the engine's
    (:func:`shardex.engine.run.run_export`), neither parameters of ``shardex.export`` nor
    options its keyword arguments could carry."""
    import dataclasses
    import inspect

    from shardex.engine.run import run_export
    from shardex.options import ExportOptions

    plumbing = {"runner", "pipeline", "spec_fingerprint", "lock"}
    assert not plumbing & set(inspect.signature(shardex.export).parameters)
    assert not plumbing & {f.name for f in dataclasses.fields(ExportOptions)}
    assert plumbing <= set(inspect.signature(run_export).parameters)

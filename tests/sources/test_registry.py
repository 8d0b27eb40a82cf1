"""The source registry: built-ins probed in the order of the chain they replace, plugin
sources (``shardex.sources`` entry points) probed first, from Python and from the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import shardex
from shardex.errors import SourceError, SourceNotFoundError
from shardex.sources import ArraySource, FolderSource, TarSource, open_source
from shardex.sources.probe import SourceSpec
from shardex.sources.registry import REGISTRY, Registry

# A plugin source: ``lines:N`` is N text samples, and a folder holding ``LINES`` is read
# as its lines (a folder the built-in image folder source would otherwise take).
_PLUGIN = """
from pathlib import Path
from shardex.sources import ArraySource

class LinesSource(ArraySource):
    kind = "lines"

    @classmethod
    def probe(cls, spec):
        if spec.text is None or spec.is_url:
            return False
        return spec.text.startswith("lines:") or (spec.is_dir and (spec.path / "LINES").is_file())

    @classmethod
    def from_spec(cls, spec):
        if spec.text.startswith("lines:"):
            texts = [f"line {i}" for i in range(int(spec.text[6:]))]
        else:
            texts = (spec.path / "LINES").read_text().splitlines()
        return cls({"key": [f"l{i}" for i in range(len(texts))], "txt": texts}, uri=spec.text)
"""


def _site(tmp_path: Path, module: str, source: str, group: str = "shardex.sources") -> Path:
    """A folder to put on the path holding package ``module`` (its code ``source``), whose
    distribution's entry point names ``module:LinesSource`` as source ``lines``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{module}.py").write_text(source)
    dist = site / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\nlines = {module}:LinesSource\n")
    return site


def test_the_builtins_are_probed_in_the_order_of_the_chain_they_replace() -> None:
    names = [e.name for e in Registry().entries() if e.origin == "built-in"]
    assert names == [
        "demo",
        "table",
        "export",
        "hf",
        "arrays",
        "tars",
        "folder",
    ]


def test_what_each_local_spec_opens(tmp_path: Path) -> None:
    tars = tmp_path / "tars"
    tars.mkdir()
    with tarfile.open(tars / "a.tar", "w"):
        pass
    (tars / ".hidden").write_text("not a sample")
    assert isinstance(open_source(tars), TarSource)
    assert isinstance(open_source(f"{tars}/*.tar"), TarSource)
    (tars / "notes.txt").write_text("x")
    assert isinstance(open_source(tars), FolderSource)  # not only tars: images
    assert isinstance(open_source({"key": ["a"], "txt": ["x"]}), ArraySource)
    with pytest.raises(SourceError, match=r"unsupported file type '\.txt'"):
        open_source(tars / "notes.txt")
    with pytest.raises(SourceNotFoundError, match="does not exist"):
        open_source(tmp_path / "nope")
    with pytest.raises(SourceError, match="'demo' or 'demo:N'"):
        open_source("demo:many")
    with pytest.raises(TypeError):
        open_source(42)  # type: ignore[arg-type]


def test_a_probe_asks_each_fact_once(tmp_path: Path) -> None:
    """Every built-in asks whether a folder is a folder; it is looked at once."""
    spec = SourceSpec(str(tmp_path))
    assert REGISTRY.open(spec).kind == "folder"
    assert {"is_dir", "has_config", "path"} <= set(vars(spec))


def test_a_name_is_registered_once_and_a_target_is_module_colon_class() -> None:
    registry = Registry()
    registry.register("mine", "mypkg:MySource")
    with pytest.raises(SourceError, match="'mine' is already registered"):
        registry.register("mine", "other:Source")
    with pytest.raises(SourceError, match="already registered"):
        registry.register("folder", "other:Source")
    with pytest.raises(SourceError, match="'module:Class'"):
        registry.register("other", "mypkg.MySource")


def test_a_plugin_source_is_probed_before_the_builtins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(_site(tmp_path, "lines_plugin_a", _PLUGIN)))
    registry = Registry()
    assert registry.entries()[0].name == "lines"
    assert "lines_plugin_a" in registry.entries()[0].origin
    source = registry.open(SourceSpec("lines:3"))
    assert source.uri == "lines:3"
    assert source.scan().table.column("key").to_pylist() == ["l0", "l1", "l2"]
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "LINES").write_text("one\ntwo\n")
    assert type(registry.open(SourceSpec(folder))).__name__ == "LinesSource"
    (folder / "LINES").unlink()
    assert isinstance(registry.open(SourceSpec(folder)), FolderSource)  # not claimed


def test_a_broken_plugin_is_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = "raise RuntimeError('this plugin is broken')\n"
    monkeypatch.syspath_prepend(str(_site(tmp_path, "lines_plugin_broken", broken)))
    with pytest.raises(SourceError) as refused:
        Registry().open(SourceSpec("demo"))
    message = str(refused.value)
    assert "source 'lines'" in message
    assert "this plugin is broken" in message
    assert "lines_plugin_broken" in message
    assert "\n" not in message


def test_a_plugin_source_works_from_the_cli(tmp_path: Path) -> None:
    site = _site(tmp_path, "lines_plugin_cli", _PLUGIN)
    path = [str(site), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "shardex.cli", "export-dataset", "lines:4", "-o", str(out), "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [s["__key__"] for s in shardex.open_dataset(out)] == ["l0", "l1", "l2", "l3"]

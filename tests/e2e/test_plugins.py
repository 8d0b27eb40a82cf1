"""A plugin backend and a plugin source, each its own package found through its entry
points (tests/support/plugins/), export from the CLI, read back, resume after a kill,
verify and overwrite: what docs/architecture.md's "Adding a backend" and "Adding a
source" promise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import shardex
from helpers import files_but_the_lock, image_field
from shardex.backends import REGISTRY
from shardex.backends.registry import Registry
from shardex.testing import SampleFolder, make_sample_folder

PLUGINS = Path(__file__).resolve().parents[1] / "support" / "plugins"


def _install(project: Path, site: Path) -> None:
    """What installing ``project`` (a pure-Python package and its pyproject.toml) leaves
    in ``site``: the package, and a dist-info whose entry_points.txt lists the
    pyproject's entry points."""
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    package = next(p for p in project.iterdir() if (p / "__init__.py").is_file())
    shutil.copytree(package, site / package.name)
    dist = site / f"{package.name}-{meta['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n"
    )
    (dist / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
            for group, points in meta["entry-points"].items()
        )
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding both plugins as installed, for PYTHONPATH or sys.path."""
    site = tmp_path_factory.mktemp("site")
    for project in ("shardex-plugin-npz", "shardex-plugin-lines"):
        _install(PLUGINS / project, site)
    return site


@pytest.fixture
def installed(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugins installed in this process too: the backend registry reads entry points
    once, so it starts again from the built-ins (undone after the test)."""
    monkeypatch.syspath_prepend(str(site))
    fresh = Registry()
    monkeypatch.setattr(REGISTRY, "_entries", fresh._entries)
    monkeypatch.setattr(REGISTRY, "_plugins", fresh._plugins)


def _env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}


def _shardex(site: Path, *args: str) -> str:
    """``shardex ARGS`` in a fresh process with the plugins installed; its output."""
    done = subprocess.run(
        [sys.executable, "-m", "shardex.cli", *args],
        env=_env(site),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# An export killed (SIGKILL, by itself) as it starts the third shard file of its split.
_KILLED = """
import os, signal, sys
import shardex
from shardex.storage import LocalStorage

source, out, backend, suffix = sys.argv[1:5]
shards = set()

class Killing(LocalStorage):
    def open_writer(self, path):
        if path.endswith(suffix):
            shards.add(path)
            if len(shards) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().open_writer(path)

shardex.export(source, Killing(out), backend=backend, workers=1, samples_per_shard=4)
"""


def _killed_then_resumed(site: Path, source: str, out: Path, backend: str, suffix: str) -> None:
    """Kill an export of ``source`` once it wrote two shards, then resume it from the CLI."""
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED, source, str(out), backend, suffix],
        env=_env(site),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert len(list(out.glob(f"*/*{suffix}"))) == 2
    assert not (out / "config.yaml").exists()
    _export(site, source, out, backend, "--mode", "resume")


def _export(site: Path, source: str, out: Path, backend: str, *more: str) -> None:
    options = f"--backend {backend} --workers 1 --samples-per-shard 4 -q".split()
    _shardex(site, "export-dataset", source, "-o", str(out), *options, *more)


def _lines(folder: SampleFolder, count: int) -> str:
    """A list file naming the first ``count`` images of ``folder``; its ``lines:`` spec."""
    base = folder.root.parent
    listed = base / f"list-{count}.txt"
    files = [next(base.glob(f"{key}.*")) for key in sorted(folder.images)[:count]]
    listed.write_text("".join(f"{f.relative_to(base).as_posix()}\n\n" for f in files))
    return f"lines:{listed}"


def test_the_plugin_backend_exports_reads_back_verifies_and_overwrites(
    site: Path, tmp_path: Path, installed: None
) -> None:
    folder = make_sample_folder(tmp_path / "src", 14)
    out = tmp_path / "out"
    _export(site, str(folder.table), out, "npz")
    assert "npz" in _shardex(site, "backend", "list")
    first = sorted(p.name for p in (out / "train").glob("npz-*.npz"))
    assert len(first) == 4  # 4 + 4 + 4 + 2
    ds = shardex.open_dataset(out)
    assert len(ds) == 14
    for sample in ds:
        assert image_field(sample) == folder.images[sample["__key__"]]
        assert sample["cls"] == b"%d" % folder.labels[sample["__key__"]]
    assert ds.get("images/class1/0004")["__key__"] == "images/class1/0004"
    assert "ok" in _shardex(site, "verify", str(out)).lower()
    assert shardex.verify(out).ok
    (out / "train" / first[1]).write_bytes(b"not a zip")  # verify notices a damaged shard
    assert not shardex.verify(out).ok

    smaller = make_sample_folder(tmp_path / "smaller", 5)
    _export(site, str(smaller.table), out, "npz", "--overwrite")
    after = shardex.open_dataset(out)
    assert {s["__key__"]: image_field(s) for s in after} == smaller.images
    assert not set(first) & {p.name for p in (out / "train").iterdir()}  # the old ones gone
    assert shardex.verify(out).ok


def test_a_killed_export_of_the_plugin_backend_resumes_to_the_same_bytes(
    site: Path, tmp_path: Path
) -> None:
    folder = make_sample_folder(tmp_path / "src", 14)
    _export(site, str(folder.table), tmp_path / "whole", "npz")
    out = tmp_path / "out"
    _killed_then_resumed(site, str(folder.table), out, "npz", ".npz")
    assert files_but_the_lock(out) == files_but_the_lock(tmp_path / "whole")
    _shardex(site, "verify", str(out))


def test_the_plugin_source_exports_from_the_cli_reads_back_verifies_and_overwrites(
    site: Path, tmp_path: Path
) -> None:
    folder = make_sample_folder(tmp_path / "src", 14)
    out = tmp_path / "out"
    _export(site, _lines(folder, 14), out, "webdataset")
    config = shardex.read_config(out)
    assert [s.kind for s in config.source_datasets] == ["lines"]
    ds = shardex.open_dataset(out)
    assert {s["__key__"]: image_field(s) for s in ds} == folder.images
    _shardex(site, "verify", str(out))

    _export(site, _lines(folder, 6), out, "webdataset", "--overwrite")
    after = shardex.open_dataset(out)
    assert [s["__key__"] for s in after] == sorted(folder.images)[:6]
    assert len(list((out / "train").glob("*.tar"))) == 2
    assert shardex.verify(out).ok


def test_a_killed_export_of_the_plugin_source_resumes_to_the_same_bytes(
    site: Path, tmp_path: Path
) -> None:
    folder = make_sample_folder(tmp_path / "src", 14)
    source = _lines(folder, 14)
    _export(site, source, tmp_path / "whole", "webdataset")
    out = tmp_path / "out"
    _killed_then_resumed(site, source, out, "webdataset", ".tar")
    assert files_but_the_lock(out) == files_but_the_lock(tmp_path / "whole")
    assert shardex.verify(out).ok

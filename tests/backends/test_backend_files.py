"""Backends declare the files they write: overwrite and resume replace exactly those (and
the export's own files), for built-in and plugin backends alike; anything else is foreign."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import shardex
from shardex.backends.base import Backend
from shardex.backends.ownership import foreign_files, shardex_files
from shardex.backends.registry import REGISTRY, get_backend
from shardex.errors import BackendError, OutputExistsError
from shardex.exporter import INTENT_FILE
from shardex.storage import open_storage

BACKENDS = [e.name for e in REGISTRY.entries() if e.available]


def _data(n: int = 5, offset: int = 0) -> dict[str, list[object]]:
    return {
        "key": [f"k{i}" for i in range(offset, offset + n)],
        "x.npy": [np.full((2, 3), i, np.float32) for i in range(offset, offset + n)],
        "label": [i % 2 for i in range(n)],
    }


def _files(root: Path) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
        for d, _, names in os.walk(root)
        for f in names
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_file_a_backend_writes_is_declared_by_it(backend: str, tmp_path: Path) -> None:
    out = tmp_path / "o"
    shardex.export(_data(), out, backend=backend, samples_per_shard=2, workers=1)
    # the second names of an overwrite with changed bytes too
    shardex.export(_data(5, 1), out, backend=backend, samples_per_shard=2, overwrite=True)
    files = _files(out)
    top = {"config.yaml", "metadata.parquet", "metadata.2.parquet"}
    split_files = [p for p in files if p not in top]
    assert split_files
    cls = type(get_backend(backend))
    assert [p for p in split_files if not cls.owns(p)] == []
    assert foreign_files(open_storage(out), files) == []


def test_a_backend_owns_only_what_it_declares() -> None:
    class Blobs(Backend):
        name: ClassVar[str] = "blobs"
        files: ClassVar[tuple[str, ...]] = (r"[^/]+/blob-[0-9a-f]+\.bin",)

    assert Blobs.owns("train/blob-00ff.bin")
    assert not Blobs.owns("blob-00ff.bin")  # not under a split
    assert not Blobs.owns("train/blob-00ff.bin.tmp")  # the whole path must match
    assert not Blobs.owns("a/b/blob-00ff.bin")
    assert not Backend.owns("train/anything")  # declares nothing, owns nothing


def test_the_exports_own_files_are_never_foreign(tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    own = ["config.yaml", INTENT_FILE, ".shardex-lock", "metadata.2.parquet", "errors.parquet"]
    assert foreign_files(storage, [*own, "notes.txt", "train/notes.txt"]) == [
        "notes.txt",
        "train/notes.txt",
    ]
    assert shardex_files(storage, ["notes.txt", *own]) == own


def test_a_foreign_file_beside_an_export_is_still_refused(tmp_path: Path) -> None:
    out = tmp_path / "o"
    shardex.export(_data(), out, backend="numpy_mmap", workers=1)
    (out / "train" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match=r"notes\.txt"):
        shardex.export(_data(), out, backend="numpy_mmap", overwrite=True)
    assert (out / "train" / "notes.txt").read_text() == "mine"


def test_an_export_of_a_backend_not_installed_here_is_named_not_called_foreign(
    tmp_path: Path,
) -> None:
    """Files no installed backend claims, in an export whose config.yaml names a backend
    this installation does not have: the error names that backend, nothing is deleted."""
    out = tmp_path / "o"
    shardex.export(_data(), out, backend="numpy_mmap", workers=1)
    config = out / "config.yaml"
    config.write_text(config.read_text().replace("backend: numpy_mmap", "backend: elsewhere", 1))
    (out / "train" / "elsewhere-run.bin").write_bytes(b"its data")
    with pytest.raises(BackendError, match=r"unknown backend 'elsewhere'") as exc:
        shardex.export(_data(), out, backend="numpy_mmap", overwrite=True)
    assert "\n" not in str(exc.value)
    assert (out / "train" / "elsewhere-run.bin").read_bytes() == b"its data"


_PLUGIN = '''
from typing import ClassVar

from shardex.backends.numpy_mmap import NumpyMmapBackend


class BlobsBackend(NumpyMmapBackend):
    """numpy_mmap runs under names no built-in backend uses."""

    name: ClassVar[str] = "blobs"
    description: ClassVar[str] = "test plugin"
    stem_name: ClassVar[str] = "blobruns"
'''

_RUN = """
import os, sys
import numpy as np
import shardex
from shardex.errors import BackendError, OutputExistsError

out = sys.argv[1]
def data(offset):
    return {
        "key": [f"k{i}" for i in range(offset, offset + 6)],
        "x.npy": [np.full((2,), i, np.float32) for i in range(offset, offset + 6)],
    }
shardex.export(data(0), out, backend="blobs", workers=1)
first = sorted(os.listdir(os.path.join(out, "train")))
assert all(n.startswith("blobruns-") for n in first), first
# overwrite a committed export of the plugin
config = shardex.export(data(1), out, backend="blobs", overwrite=True)
assert [s["__key__"] for s in shardex.open_dataset(out)] == [f"k{i}" for i in range(1, 7)]
# an export killed before it committed: its files, no config.yaml
os.remove(os.path.join(out, "config.yaml"))
try:
    shardex.export(data(1), out, backend="blobs")
except OutputExistsError as exc:
    assert "--mode resume" in str(exc), exc
else:
    raise AssertionError("a leftover export was not noticed")
shardex.export(data(1), out, backend="blobs", mode="resume")
assert [s["__key__"] for s in shardex.open_dataset(out)] == [f"k{i}" for i in range(1, 7)]
assert shardex.verify(out).ok
print("plugin ok", sorted(os.listdir(os.path.join(out, "train"))))
"""


def _run_with_plugin(
    tmp_path: Path, name: str, module: str, backend: str, code: str, out: Path
) -> subprocess.CompletedProcess[str]:
    """``python -c code out`` with a plugin installed: a package ``{name}_plugin`` (of
    source ``module``, under ``tmp_path / "site"``) whose entry point registers its class
    ``backend`` as backend ``name``. It must succeed."""
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{name}_plugin.py").write_text(module)
    dist = site / f"{name}_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[shardex.backends]\n{name} = {name}_plugin:{backend}\n"
    )
    path = [str(site), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_a_plugin_backends_exports_can_be_overwritten_and_resumed(tmp_path: Path) -> None:
    """A backend registered through the entry-point group writes files under its own names;
    overwrite and resume of its exports work (they were once refused as foreign)."""
    plugin = textwrap.dedent(_PLUGIN)
    done = _run_with_plugin(tmp_path, "blobs", plugin, "BlobsBackend", _RUN, tmp_path / "out")
    assert "plugin ok" in done.stdout


_BROKEN_RUN = """
import sys
import shardex
from shardex.errors import OutputExistsError

out = sys.argv[1]
try:
    shardex.export({"key": ["a"], "txt": ["x"]}, out, workers=1)
except OutputExistsError as exc:
    print("refused:", exc)
"""


def test_a_broken_plugin_does_not_turn_a_foreign_folder_into_a_traceback(
    tmp_path: Path,
) -> None:
    """Refusing a folder of someone else's files asks every registered backend whether the
    files are its own; a plugin that fails to import (its own bug, not a missing package)
    must not replace that refusal with its traceback."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"someone else's photo")
    broken = "raise RuntimeError('this plugin is broken')\n"
    done = _run_with_plugin(tmp_path, "broken", broken, "BrokenBackend", _BROKEN_RUN, out)
    assert "refused:" in done.stdout
    assert "holiday.jpg" in done.stdout
    assert (out / "holiday.jpg").read_bytes() == b"someone else's photo"


ARRAY_BACKENDS = [b for b in BACKENDS if b != "webdataset"]


@pytest.mark.parametrize("backend", ARRAY_BACKENDS)
def test_files_another_backend_would_write_are_foreign_in_an_export_of_this_one(
    backend: str, tmp_path: Path
) -> None:
    """Ownership follows the backend that wrote the export: a ``train/shards.txt`` (a
    webdataset file name) in an array export is the user's, refused, never deleted."""
    out = tmp_path / "o"
    shardex.export(_data(), out, backend=backend, workers=1)
    mine = out / "train" / "shards.txt"
    mine.write_text("my list of shards\n")
    with pytest.raises(OutputExistsError, match=r"shards\.txt"):
        shardex.export(_data(5, 1), out, backend=backend, overwrite=True)
    assert mine.read_text() == "my list of shards\n"
    assert shardex.verify(out).ok


def test_switching_backends_by_overwrite_removes_the_old_ones_files_even_after_a_kill(
    tmp_path: Path,
) -> None:
    """The old backend's files stay shardex's while a run of another backend replaces
    them, also when that run was killed and another takes over."""
    out = tmp_path / "o"
    shardex.export(_data(), out, backend="webdataset", workers=1)
    storage = open_storage(out)
    from shardex.engine.output import record_intent

    record_intent(storage, "overwrite", "killed run", backend="numpy_mmap")  # then killed
    (out / "train" / "arrays-0123456789ab-000000.x.npy").write_bytes(b"half")
    shardex.export(_data(), out, backend="numpy", overwrite=True)
    left = _files(out)
    assert not [p for p in left if p.endswith((".tar", "shards.txt", ".x.npy"))], left
    assert shardex.verify(out).ok

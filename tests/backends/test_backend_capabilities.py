"""Readers accept an export because of what its backend declares, never because of its
name: for every backend, each reader works exactly when the declaration says it does, and
refuses in one line otherwise."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import shardex
from shardex.backends.registry import REGISTRY, get_backend
from shardex.dali import reader_arguments
from shardex.dataset import SampleRanges
from shardex.errors import ConfigError

BACKENDS = [e.name for e in REGISTRY.entries() if e.available]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("caps")
    data = {
        "key": [f"k{i}" for i in range(6)],
        "x.npy": [np.full((2,), i, np.float32) for i in range(6)],
        "label": [i % 2 for i in range(6)],
    }
    out = {}
    for name in BACKENDS:
        out[name] = root / name
        shardex.export(data, out[name], backend=name, samples_per_shard=2, workers=1)
    return out


def _refused_in_one_line(backend: str, read: Callable[[], object]) -> ConfigError:
    """``read()`` is refused with a ConfigError of one line naming ``backend``."""
    with pytest.raises(ConfigError) as exc:
        read()
    message = str(exc.value)
    assert "\n" not in message, message
    assert repr(backend) in message, message
    return exc.value


@pytest.mark.parametrize("backend", BACKENDS)
def test_dali_reads_what_declares_dali_index_files(backend: str, exports: dict[str, Path]) -> None:
    if get_backend(backend).capabilities.dali:
        args = reader_arguments(exports[backend])
        assert len(args.paths) == 3
        assert args.index_paths is not None
        assert all(Path(p).is_file() for p in (*args.paths, *args.index_paths))
    else:
        _refused_in_one_line(backend, lambda: reader_arguments(exports[backend]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_streaming_reads_what_stores_samples_as_byte_ranges(
    backend: str, exports: dict[str, Path]
) -> None:
    pytest.importorskip("torch")
    from shardex.torch import StreamDataset

    ds = StreamDataset(exports[backend], shuffle=False, decode=False)
    if isinstance(shardex.open_dataset(exports[backend]), SampleRanges):
        assert sorted(s["__key__"] for s in ds) == [f"k{i}" for i in range(6)]
    else:
        _refused_in_one_line(backend, lambda: list(ds))


@pytest.mark.parametrize("backend", BACKENDS)
def test_window_loader_reads_what_declares_shard_windows(
    backend: str, exports: dict[str, Path]
) -> None:
    pytest.importorskip("torch")
    from shardex.torch import TensorShardsLoader

    if get_backend(backend).capabilities.shard_windows:
        loader = TensorShardsLoader(exports[backend], 4, shuffle_shards=False, seed=0)
        keys = [k for batch in loader for k in batch["__key__"]]
        assert sorted(keys) == [f"k{i}" for i in range(6)]
    else:
        error = _refused_in_one_line(backend, lambda: TensorShardsLoader(exports[backend], 4))
        # the refusal names the capability, not the built-in backends that have it
        others = {b for b in BACKENDS if b != backend}
        assert not [b for b in others if repr(b) in str(error)], error


_WINDOWED_PLUGIN = """
from functools import cached_property
from typing import Any, ClassVar

from shardex.backends.base import Capabilities
from shardex.backends.numpy_mmap import NumpyMmapBackend, NumpyMmapDataset
from shardex.dataset import ShardWindows


class WindowedDataset(ShardWindows):
    \"\"\"Not an array backend's dataset: it only implements ShardWindows (delegating).\"\"\"

    def __init__(self, storage, config, split, *, decode=False, verify=True, on_error="raise"):
        self.storage, self.config, self.split = storage, config, split
        self.decode, self.verify, self.on_error = decode, verify, on_error
        self._inner = NumpyMmapDataset(storage, config, split, decode=decode)
        self.layout = self._inner.layout
        self.loaded = []

    def __len__(self):
        return len(self._inner)

    def __getitem__(self, index):
        return self._inner[index]

    def get(self, key):
        return self._inner.get(key)

    @cached_property
    def metadata(self):
        return self._inner.metadata

    @property
    def shard_sizes(self):
        return tuple(s.num_samples for s in self._inner.shards)

    def shard_columns(self, shard):
        self.loaded.append(shard)
        return self._inner._load(self._inner.shards[shard])


class WindowedBackend(NumpyMmapBackend):
    name: ClassVar[str] = "windowed"
    description: ClassVar[str] = "test plugin: numpy_mmap runs read by the window loader"
    stem_name: ClassVar[str] = "windowruns"
    capabilities: ClassVar[Capabilities] = Capabilities(
        random_access=True, streaming=True, remote=True, shard_windows=True
    )
    dataset: ClassVar[Any] = WindowedDataset


class UndeclaredBackend(WindowedBackend):
    name: ClassVar[str] = "undeclared"
    stem_name: ClassVar[str] = "undeclaredruns"
    dataset: ClassVar[Any] = NumpyMmapDataset  # declares shard_windows, reads no windows
"""


def test_a_plugin_backend_declaring_shard_windows_is_read_by_the_window_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader asks for the capability and the ShardWindows interface, not for a
    built-in dataset class: a plugin's own dataset is read; a plugin that declares the
    capability without the interface is refused in one line that names it."""
    pytest.importorskip("torch")
    from shardex.backends.registry import register_backend
    from shardex.torch import TensorShardsLoader

    (tmp_path / "windowed_plugin.py").write_text(_WINDOWED_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(REGISTRY, "_entries", dict(REGISTRY._entries))  # undone after
    register_backend("windowed", "windowed_plugin:WindowedBackend")
    register_backend("undeclared", "windowed_plugin:UndeclaredBackend")
    data = {"key": [f"k{i}" for i in range(10)], "label": [i % 3 for i in range(10)]}
    shardex.export(data, tmp_path / "w", backend="windowed", workers=1)
    loader = TensorShardsLoader(tmp_path / "w", 4, shuffle_shards=False, shuffle_samples=False)
    batches = list(loader)
    assert [b["__key__"] for b in batches] == [
        [f"k{i}" for i in range(a, min(a + 4, 10))] for a in (0, 4, 8)
    ]
    assert batches[1]["cls"].tolist() == [1, 2, 0, 1]
    assert loader.dataset.loaded == [0]  # type: ignore[attr-defined]  # the plugin's reads
    shardex.export(data, tmp_path / "u", backend="undeclared", workers=1)
    error = _refused_in_one_line("undeclared", lambda: TensorShardsLoader(tmp_path / "u", 4))
    assert "ShardWindows" in str(error)


def test_verify_reports_an_export_whose_backend_is_not_registered(
    exports: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(exports["webdataset"], copy)
    config = copy / "config.yaml"
    config.write_text(config.read_text().replace("backend: webdataset", "backend: nosuch", 1))
    report = shardex.verify(copy)
    assert not report.ok
    assert [p.kind for p in report.problems] == ["backend"]
    assert "'nosuch'" in report.problems[0].message

"""Readers accept an export because of what its backend declares, never because of its
name: for every backend, each reader works exactly when the declaration says it does, and
refuses in one line otherwise."""

from __future__ import annotations

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


def _refused_in_one_line(exc: pytest.ExceptionInfo[ConfigError], backend: str) -> None:
    message = str(exc.value)
    assert "\n" not in message, message
    assert repr(backend) in message, message


@pytest.mark.parametrize("backend", BACKENDS)
def test_dali_reads_what_declares_dali_index_files(backend: str, exports: dict[str, Path]) -> None:
    if get_backend(backend).capabilities.dali:
        args = reader_arguments(exports[backend])
        assert len(args.paths) == 3
        assert args.index_paths is not None
        assert all(Path(p).is_file() for p in (*args.paths, *args.index_paths))
    else:
        with pytest.raises(ConfigError) as exc:
            reader_arguments(exports[backend])
        _refused_in_one_line(exc, backend)


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
        with pytest.raises(ConfigError) as exc:
            list(ds)
        _refused_in_one_line(exc, backend)


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
        with pytest.raises(ConfigError) as exc:
            TensorShardsLoader(exports[backend], 4)
        _refused_in_one_line(exc, backend)


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

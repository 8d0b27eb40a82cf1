from __future__ import annotations

from pathlib import Path

import pytest

from shardex.storage import LocalStorage, open_storage
from shardex.testing import StorageTests


class TestLocalStorage(StorageTests):
    @pytest.fixture
    def storage(self, tmp_path: Path) -> LocalStorage:
        return LocalStorage(tmp_path / "root")


def test_open_storage_normalises_inputs(tmp_path: Path) -> None:
    assert open_storage(tmp_path).uri == str(tmp_path)
    assert open_storage(str(tmp_path)).uri == str(tmp_path)
    assert open_storage(f"file://{tmp_path}").uri == str(tmp_path)
    store = LocalStorage(tmp_path)
    assert open_storage(store) is store


def test_no_temporary_files_after_abort(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path)
    writer = store.open_writer("x/y.bin")
    writer.write(b"abc")
    writer.abort()
    assert [p.name for p in (tmp_path / "x").iterdir()] == []


def test_sync_reaches_every_file_and_reports_one_that_is_gone(tmp_path: Path) -> None:
    # the fsyncs of an export's files run on threads: each file is still opened and
    # synced (a missing one fails the sync, as it did one by one)
    storage = LocalStorage(tmp_path)
    names = [f"s{i % 3}/f{i}.bin" for i in range(40)]
    for name in names:
        storage.put(name, name.encode())
    storage.sync(names)
    with pytest.raises(FileNotFoundError):
        storage.sync([*names[:20], "s1/gone.bin", *names[20:]])

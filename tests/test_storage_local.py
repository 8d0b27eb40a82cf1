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

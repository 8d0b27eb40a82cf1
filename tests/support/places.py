"""Where a test puts a source or an export: a local folder, ``memory://`` or a prefix on the
test S3 server, behind one interface (what the ``storage`` fixture of tests/conftest.py
gives), so that one test covers behaviour that does not depend on the storage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from shardex.storage import LocalStorage, ObjectStorage, Storage
from shardex.storage.memory import MemoryStorage
from tests.support.s3data import S3Location, upload

Kind = Literal["local", "memory", "s3"]
KINDS: tuple[Kind, ...] = ("local", "memory", "s3")


@dataclass(frozen=True)
class Place:
    """A fresh, empty root of one kind of storage."""

    kind: Kind
    url: str  # a folder's path, memory://NAME or s3://bucket/prefix
    options: dict[str, Any] | None  # its storage options (only S3 has any)
    store: Storage  # the root, opened
    s3: S3Location | None = None  # the server's prefix (kind s3)

    def child(self, name: str) -> str:
        return f"{self.url}/{name}"

    def put(self, files: dict[str, bytes], under: str) -> str:
        """Write ``files`` below ``under``; the URL of ``under`` (a source's)."""
        upload(self.store, {f"{under}/{name}": data for name, data in files.items()})
        return self.child(under)


def opened(kind: Kind, tmp_path: Path, request: pytest.FixtureRequest) -> Place:
    """A place of ``kind`` (from the fixtures ``memory_storage`` and ``s3``)."""
    if kind == "local":
        root = tmp_path / "storage"
        return Place(kind, str(root), None, LocalStorage(root))
    if kind == "memory":
        store: MemoryStorage = request.getfixturevalue("memory_storage")
        return Place(kind, store.uri, None, store)
    s3: S3Location = request.getfixturevalue("s3")
    return Place(kind, s3.url, s3.direct, ObjectStorage(s3.url, s3.direct), s3)
